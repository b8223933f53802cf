"""Workers end to end: claim, steps, heartbeats, settle, retries, cancellation, fencing."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from typing import Any
from uuid import UUID

import pytest

from steptrail import App, RunContext
from steptrail.domain.enums import Outcome, RunStatus, Segment, TerminationReason
from steptrail.domain.errors import StoreUnavailable
from steptrail.domain.ports import ClaimedRun, ClaimRequest
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
from tests.conftest import make_runtime


def events_of(rt: Runtime, run_id: UUID) -> list[str]:
    return [type(h.event).__name__ for h in rt.history(run_id)]


def test_work__runs_complete_with_gap_free_steps(runtime: Runtime) -> None:
    """Burst work completes every queued run, recording contiguous step numbers."""
    ids = [runtime.enqueue("scripted", {"steps": 3}) for _ in range(4)]
    report = runtime.work(concurrency=2, burst=True)
    assert report.outcomes["completed"] == 4
    for run_id in ids:
        row = runtime.get(run_id)
        assert row.status is RunStatus.COMPLETED
        seqs = [h.event.seq for h in runtime.history(run_id) if hasattr(h.event, "seq")]
        assert seqs == [1, 2, 3]


def test_retry__transient_failure_requeued_then_completes(runtime: Runtime) -> None:
    """A server error requeues the run with backoff; the next execution completes it."""
    run_id = runtime.enqueue(
        "scripted", {"steps": 3, "fail": {"class": "server_error", "at": 2, "times": 1}}
    )
    worker = runtime.worker(concurrency=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not runtime.get(run_id).status.is_terminal:
        time.sleep(0.05)
    worker.stop()
    thread.join()
    row = runtime.get(run_id)
    assert row.status is RunStatus.COMPLETED
    assert row.state.requeue_count == 1
    requeued = [h.event for h in runtime.history(run_id) if isinstance(h.event, Run.Requeued)]
    assert [r.delay_ms for r in requeued] == [50]
    assert requeued[0].failure_class == "server_error"


def test_retry__not_retryable_dead_letters_without_message(runtime: Runtime) -> None:
    """An auth failure dead-letters at once; the log keeps the error class, not its text."""
    run_id = runtime.enqueue("scripted", {"steps": 2, "fail": {"class": "auth", "at": 1}})
    runtime.work(burst=True)
    row = runtime.get(run_id)
    assert row.status is RunStatus.FAILED
    assert row.state.reason is TerminationReason.NOT_RETRYABLE
    assert row.state.failure_class == "auth"
    trail = json.dumps([h.event.model_dump(mode="json") for h in runtime.history(run_id)])
    assert "HttpStatusError" in trail
    assert "HTTP 401" not in trail


def test_retry__budget_shared_and_exhausted(db_url: str) -> None:
    """A run that always fails transiently executes 1 + max_requeues times, then dead-letters."""
    rt = make_runtime(db_url, max_requeues=2, retry_base_seconds=0.01)
    try:
        run_id = rt.enqueue("scripted", {"steps": 1, "fail": {"class": "connection", "at": 1}})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not rt.get(run_id).status.is_terminal:
            rt.work(burst=True)
            time.sleep(0.02)
        row = rt.get(run_id)
        assert row.state.reason is TerminationReason.RETRIES_EXHAUSTED
        assert events_of(rt, run_id).count("Claimed") == 3
    finally:
        rt.close()


def flaky_write_app(calls: list[str]) -> App:
    app = App()
    app.tool("charge_card", effect="non_idempotent_write")

    @app.agent("payer")
    def payer(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        def charge() -> None:
            calls.append("charge")
            raise ConnectionError("timed out after sending")

        ctx.tool("charge_card", charge, arguments={"amount": 5})
        return {}

    return app


def test_retry__pending_non_idempotent_write_is_not_retried(db_url: str) -> None:
    """A write that raised may have happened: the run dead-letters instead of charging twice."""
    calls: list[str] = []
    rt = make_runtime(db_url, app=flaky_write_app(calls))
    try:
        run_id = rt.enqueue("payer", {})
        rt.work(burst=True)
        time.sleep(0.1)
        rt.work(burst=True)
        row = rt.get(run_id)
        assert calls == ["charge"]
        assert row.state.reason is TerminationReason.NOT_RETRYABLE
        assert [p.tool for p in row.state.pending_effects] == ["charge_card"]
    finally:
        rt.close()


def test_tool__marker_is_durable_before_the_write_runs(db_url: str) -> None:
    """When a write tool's code runs, its pending-effect marker is already in the log."""
    seen: list[list[str]] = []
    app = App()
    app.tool("send_email", effect="non_idempotent_write")
    rt = make_runtime(db_url, app=app)

    @app.agent("mailer")
    def mailer(ctx: RunContext, request: dict[str, Any]) -> None:
        ctx.tool("send_email", lambda: seen.append(events_of(rt, ctx.run_id)))

    try:
        rt.app.include(app)
        run_id = rt.enqueue("mailer", {})
        rt.work(burst=True)
        assert seen[0][-1] == "EffectPending"
        assert rt.get(run_id).state.pending_effects == ()
    finally:
        rt.close()


class Gate:
    """Blocks an agent inside a step until the test releases it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.after: list[str] = []

    def wait(self) -> str:
        self.entered.set()
        assert self.release.wait(10)
        return "done"


def gated_app(gate: Gate) -> App:
    app = App()
    app.tool("send_email", effect="non_idempotent_write")

    @app.agent("gated")
    def gated(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("blocked", gate.wait)
        gate.after.append("step-2")
        ctx.tool("send_email", lambda: gate.after.append("email-sent"))
        return {}

    return app


def run_in_thread(rt: Runtime, results: list[Any]) -> threading.Thread:
    def target() -> None:
        worker = rt.worker(concurrency=1, burst=True, on_result=results.append)
        worker.run()

    thread = threading.Thread(target=target)
    thread.start()
    return thread


def test_cancel__running_run_observed_at_next_step(db_url: str) -> None:
    """A cancel lands while a step runs; the worker stops at the boundary with `cancelled`."""
    gate = Gate()
    rt = make_runtime(db_url, app=gated_app(gate))
    try:
        run_id = rt.enqueue("gated", {})
        results: list[Any] = []
        thread = run_in_thread(rt, results)
        assert gate.entered.wait(10)
        assert rt.cancel(run_id, by="op").status is RunStatus.CANCELLED
        gate.release.set()
        thread.join(10)
        assert [r.outcome for r in results] == [Outcome.CANCELLED]
        assert events_of(rt, run_id)[-1] == "Cancelled"
        # The agent's own code after the step may run; the next boundary (here the write
        # tool's marker) is where the cancel is observed, so the write never happens.
        assert "email-sent" not in gate.after
    finally:
        rt.close()


def test_zombie__taken_over_segment_cannot_record_settle_or_write(db_url: str) -> None:
    """A paused worker whose run was reclaimed and re-claimed records, settles and writes
    nothing when it resumes; the new owner finishes the run."""
    gate = Gate()
    rt = make_runtime(db_url, app=gated_app(gate))
    try:
        run_id = rt.enqueue("gated", {})
        results: list[Any] = []
        thread = run_in_thread(rt, results)
        assert gate.entered.wait(10)
        stale = rt.store.load(run_id)
        stale.reclaim(actor="reaper:test")
        rt.store.append(stale)
        taken = rt.store.claim(holder="worker:other", lease_ms=60_000, agents=["gated"])
        assert taken is not None
        gate.release.set()
        thread.join(10)
        assert [r.outcome for r in results] == [Outcome.LEASE_LOST]
        assert "email-sent" not in gate.after
        trail = rt.history(run_id)
        zombie_holder = trail[1].event.actor
        assert all(h.event.actor != zombie_holder for h in trail[2:])
        new_owner = taken.run
        new_owner.complete()
        rt.store.append(new_owner)
        assert rt.get(run_id).status is RunStatus.COMPLETED
    finally:
        rt.close()


def test_lease__long_step_renewed_in_background(db_url: str) -> None:
    """A step longer than the lease keeps its run: the keeper renews, the reaper skips it."""
    rt = make_runtime(db_url, lease_seconds=0.6)
    try:
        run_id = rt.enqueue("scripted", {"steps": 1, "sleep": 1.5})
        stop = threading.Event()
        reaper = threading.Thread(
            target=rt.reaper().reap_every, args=(0.05,), kwargs={"stop": stop}
        )
        reaper.start()
        report = rt.work(burst=True)
        stop.set()
        reaper.join()
        assert report.outcomes == {"completed": 1}
        names = events_of(rt, run_id)
        assert "LeaseRenewed" in names
        assert "Reclaimed" not in names
    finally:
        rt.close()


class FlakyStore:
    """The real store, except that appends can be made to fail (or to land but look failed)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.mode = "ok"

    def append(
        self, run: Run, *, resumable: bytes | None = None, then_claim: ClaimRequest | None = None
    ) -> list[ClaimedRun]:
        if self.mode == "down":
            raise StoreUnavailable("connection refused")
        if self.mode == "lost-ack":
            self.inner.append(run, resumable=resumable, then_claim=then_claim)
            self.mode = "ok"
            raise StoreUnavailable("server closed the connection unexpectedly")
        if self.mode == "lost-ack-then-load-fails":
            # Committed, but the caller's run is left as a lost reply leaves it: pending.
            self.inner.append(copy.deepcopy(run), resumable=resumable, then_claim=then_claim)
            self.mode = "load-fails-once"
            raise StoreUnavailable("server closed the connection unexpectedly")
        claimed: list[ClaimedRun] = self.inner.append(
            run, resumable=resumable, then_claim=then_claim
        )
        return claimed

    def load(self, run_id: UUID) -> Run | None:
        if self.mode == "down":
            raise StoreUnavailable("connection refused")
        if self.mode == "load-fails-once":
            self.mode = "ok"
            raise StoreUnavailable("connection refused")
        return self.inner.load(run_id)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_self_fence__store_down_for_half_a_lease_gives_the_run_up(db_url: str) -> None:
    """With the store unreachable, the segment retries for half a lease, then stops
    acting: outcome lease_lost, and the write tool never runs."""
    gate = Gate()
    rt = make_runtime(db_url, app=gated_app(gate), lease_seconds=1.0)
    try:
        flaky = FlakyStore(rt.store)
        rt.store = flaky  # type: ignore[assignment]
        run_id = rt.enqueue("gated", {})
        results: list[Any] = []
        thread = run_in_thread(rt, results)
        assert gate.entered.wait(10)
        flaky.mode = "down"
        gate.release.set()
        thread.join(15)
        assert [r.outcome for r in results] == [Outcome.LEASE_LOST]
        assert "email-sent" not in gate.after
        flaky.mode = "ok"
        assert rt.get(run_id).status is RunStatus.RUNNING
    finally:
        rt.close()


def test_ambiguous_append__landed_commit_is_recognised(db_url: str) -> None:
    """An append that committed but whose answer was lost is recognised as ours, not a loss."""
    gate = Gate()
    rt = make_runtime(db_url, app=gated_app(gate))
    try:
        flaky = FlakyStore(rt.store)
        rt.store = flaky  # type: ignore[assignment]
        run_id = rt.enqueue("gated", {})
        results: list[Any] = []
        thread = run_in_thread(rt, results)
        assert gate.entered.wait(10)
        flaky.mode = "lost-ack"
        gate.release.set()
        thread.join(10)
        assert [r.outcome for r in results] == [Outcome.COMPLETED]
        assert events_of(rt, run_id).count("StepRecorded") == 2
    finally:
        rt.close()


def test_ambiguous_append__own_write_is_not_a_conflict(db_url: str) -> None:
    """The reply to an append is lost and the load that follows fails too: the segment
    sends nothing blind, finds its own write once the store answers, and completes (the
    write tool runs; no lease_lost, no dead letter)."""
    gate = Gate()
    rt = make_runtime(db_url, app=gated_app(gate))
    try:
        flaky = FlakyStore(rt.store)
        rt.store = flaky  # type: ignore[assignment]
        run_id = rt.enqueue("gated", {})
        results: list[Any] = []
        thread = run_in_thread(rt, results)
        assert gate.entered.wait(10)
        flaky.mode = "lost-ack-then-load-fails"
        gate.release.set()
        thread.join(10)
        assert [r.outcome for r in results] == [Outcome.COMPLETED]
        assert "email-sent" in gate.after
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert events_of(rt, run_id).count("StepRecorded") == 2
    finally:
        rt.close()


def test_concurrency__100_sleeping_runs_in_one_worker(db_url: str) -> None:
    """One worker process runs 100 runs at once when their steps wait on I/O."""
    in_flight = {"now": 0, "peak": 0}
    lock = threading.Lock()
    app = App()

    @app.agent("sleeper")
    def sleeper(ctx: RunContext, request: dict[str, Any]) -> None:
        def nap() -> None:
            with lock:
                in_flight["now"] += 1
                in_flight["peak"] = max(in_flight["peak"], in_flight["now"])
            time.sleep(1.0)
            with lock:
                in_flight["now"] -= 1

        ctx.step("io", "nap", nap)

    rt = make_runtime(db_url, app=app, lease_seconds=30)
    try:
        for _ in range(100):
            rt.enqueue("sleeper", {})
        report = rt.work(concurrency=100, burst=True)
        assert report.outcomes == {"completed": 100}
        assert in_flight["peak"] >= 50
    finally:
        rt.close()


def test_interactive__runs_in_caller_and_is_not_retried(runtime: Runtime) -> None:
    """An interactive run holds an interactive lease, completes in-process, and a
    transient failure fails it outright instead of requeueing."""
    done = runtime.start("scripted", {"steps": 2})
    assert done.outcome is Outcome.COMPLETED
    trail = runtime.history(done.run_id)
    assert trail[0].event.actor.startswith("interactive:")
    failed = runtime.start("scripted", {"steps": 2, "fail": {"class": "server_error", "at": 1}})
    row = runtime.get(failed.run_id)
    assert failed.outcome is Outcome.FAILED
    assert row.state.reason is TerminationReason.PROVIDER_FAILED
    assert "Requeued" not in events_of(runtime, failed.run_id)


def test_interactive__segment_kind_recorded(runtime: Runtime) -> None:
    """The first event of an interactive run puts it in the interactive segment."""
    gate_done = runtime.start("scripted", {"steps": 1})
    state = Run.replay(h.event for h in runtime.history(gate_done.run_id)[:1]).state
    assert state.segment is Segment.INTERACTIVE


@pytest.mark.parametrize("request_body", [{"steps": -1}, {"nope": 1}])
def test_enqueue__invalid_request_writes_nothing(runtime: Runtime, request_body: Any) -> None:
    """A request the agent's model rejects raises before anything is written."""
    from steptrail.runtime import InvalidRequest

    with pytest.raises(InvalidRequest):
        runtime.enqueue("scripted", request_body)
    assert runtime.store.all_rows() == []


def test_enqueue__unserialisable_request_fails_closed(runtime: Runtime) -> None:
    """A request that is not JSON raises and writes nothing."""
    from steptrail.runtime import InvalidRequest

    app = App()
    app.add_agent("free", lambda ctx, req: None)
    runtime.app.include(app)
    with pytest.raises(InvalidRequest):
        runtime.enqueue("free", {"when": object()})
    assert runtime.store.all_rows() == []


def test_idle_worker__woken_by_new_work_not_by_polling(pg_url: str) -> None:
    """PostgreSQL: an idle worker polling only every 30 s still starts a new run at once,
    because the enqueue's NOTIFY wakes it."""
    rt = make_runtime(pg_url, poll_interval=30)
    try:
        results: list[Any] = []
        worker = rt.worker(on_result=results.append)
        thread = threading.Thread(target=worker.run)
        thread.start()
        time.sleep(1.0)  # let it find the queue empty and go to sleep on LISTEN
        rt.enqueue("scripted", {"steps": 1})
        deadline = time.monotonic() + 10
        while not results and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.stop()
        thread.join(10)
        assert [r.outcome for r in results] == [Outcome.COMPLETED]
    finally:
        rt.close()


class FailsFirst:
    """The real store, except that the first `failures` calls of its `method` raise `error`."""

    def __init__(self, inner: Any, method: str, error: Exception, failures: int) -> None:
        self.inner = inner
        self.method = method
        self.error = error
        self.failures = failures
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.inner, name)
        if name != self.method:
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls <= self.failures:
                raise self.error
            return real(*args, **kwargs)

        return call


@pytest.mark.parametrize(
    ("error", "event", "level"),
    [
        (StoreUnavailable("connection refused"), "claim_failed", "warning"),
        (RuntimeError("function steptrail_claim(...) does not exist"), "claim_error", "error"),
    ],
)
def test_claim_error__worker_backs_off_and_goes_on(
    db_url: str, error: Exception, event: str, level: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim that fails, for a lost connection or for anything else (a schema changed
    under the worker, a row that does not decode), is logged and tried again after a
    backoff: the dispatcher does not go down and take the runs in flight with it."""
    rt = make_runtime(db_url)
    try:
        failing = FailsFirst(rt.store, "claim_batch", error, failures=2)
        rt.store = failing  # type: ignore[assignment]
        run_ids = [rt.enqueue("scripted", {"steps": 1}) for _ in range(3)]
        with caplog.at_level(logging.WARNING, logger="steptrail"):
            report = rt.work(concurrency=2, burst=True)
        assert report.outcomes == {"completed": 3}
        assert failing.calls > 2
        logged = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
        failed = [entry for entry in logged if entry["event"] == event]
        assert len(failed) == 2
        assert {entry["level"] for entry in failed} == {level}
        assert all(rt.get(run_id).status is RunStatus.COMPLETED for run_id in run_ids)
    finally:
        rt.close()


@pytest.mark.parametrize(
    ("error", "event"),
    [
        (StoreUnavailable("connection refused"), "reap_failed"),
        (RuntimeError("function steptrail_stale(integer) does not exist"), "reap_error"),
    ],
)
def test_reap_every__a_failed_pass_is_logged_and_the_next_one_reaps(
    db_url: str, error: Exception, event: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`reap --every` is a daemon: a pass that fails, for a lost connection or anything
    else, is logged and the loop goes on; a later pass reclaims the stale run."""
    rt = make_runtime(db_url, lease_seconds=0.2)
    stop = threading.Event()
    try:
        run_id = rt.enqueue("scripted", {"steps": 1})
        assert rt.store.claim(holder="dead-worker", lease_ms=200, agents=["scripted"])
        time.sleep(0.4)  # the lease runs out: nobody renews it
        reaper = rt.reaper()
        failing = FailsFirst(rt.store, "stale", error, failures=2)
        reaper.store = failing  # type: ignore[assignment]
        reaped: list[int] = []

        def on_report(report: Any) -> None:
            reaped.append(report.reaped)
            if report.reaped:
                stop.set()

        with caplog.at_level(logging.WARNING, logger="steptrail"):
            thread = threading.Thread(
                target=reaper.reap_every,
                args=(0.05,),
                kwargs={"stop": stop, "on_report": on_report},
            )
            thread.start()
            thread.join(10)
        assert not thread.is_alive()
        assert failing.calls >= 3
        assert 1 in reaped
        assert rt.get(run_id).status is RunStatus.QUEUED
        logged = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
        assert [entry["event"] for entry in logged].count(event) == 2
    finally:
        stop.set()
        rt.close()
