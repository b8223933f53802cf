"""Reporting views: exactly-once tracking, rebuild equals live, audit replay, snapshots."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steptrail.domain.enums import Effect, FailureClass, RunStatus, TerminationReason, WaitKind
from steptrail.domain.errors import IllegalTransition, VersionConflict
from steptrail.domain.run import Run, fold
from steptrail.infrastructure import codec, pg_bulk, pg_reads, sqlite_bulk, sqlite_reads
from steptrail.infrastructure.reporting_store import ReportingStore
from steptrail.runtime import Runtime
from steptrail.workers.projector import Projector


def scripted_mix(rt: Runtime) -> list[UUID]:
    """Runs that complete, retry, dead-letter, wait and get cancelled."""
    ids = [rt.enqueue("scripted", {"steps": 2}) for _ in range(3)]
    ids.append(rt.enqueue("scripted", {"steps": 1, "fail": {"class": "auth", "at": 1}}))
    ids.append(rt.enqueue("scripted", {"steps": 2, "approval": {"at": 2}}))
    doomed = rt.enqueue("scripted", {})
    rt.cancel(doomed)
    rt.work(concurrency=2, burst=True)
    return [*ids, doomed]


def test_views__follow_the_log_and_equal_a_rebuild(runtime: Runtime) -> None:
    """After catching up, the views count every run once and equal a fold from scratch."""
    scripted_mix(runtime)
    assert runtime.project() > 0
    counts = runtime.views.status_counts()
    assert counts == {
        ("scripted", "completed"): 3,
        ("scripted", "failed"): 1,
        ("scripted", "waiting_for_approval"): 1,
        ("scripted", "cancelled"): 1,
    }
    (dead,) = runtime.views.dead_letters()
    assert (dead.reason, dead.failure_class, dead.cause) == (
        "not_retryable",
        "auth",
        "failure_not_retryable",
    )
    assert runtime.verify() == []


def test_views__summary_has_steps_tokens_and_duration(runtime: Runtime) -> None:
    """A run summary carries its steps, tokens, cost and time from creation to end."""
    run_id = runtime.enqueue("scripted", {"steps": 3})
    runtime.work(burst=True)
    runtime.project()
    summary = runtime.views.summary(run_id)
    assert summary is not None
    assert (summary.steps, summary.state.tokens) == (3, 30)
    assert summary.ended_at is not None
    assert summary.created_at is not None
    assert summary.ended_at >= summary.created_at


class CrashingDialect:
    """The store's dialect, except that the batch dies just before it would commit."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.crash = True

    def reporting_write(self) -> Any:
        outer = self

        class Wrapped:
            def __enter__(self) -> Any:
                self.cm = outer.inner.reporting_write()
                self.tx = self.cm.__enter__()
                return Tx(self.tx)

            def __exit__(self, *exc: Any) -> Any:
                return self.cm.__exit__(*exc)

        class Tx:
            def __init__(self, tx: Any) -> None:
                self.tx = tx

            def all(self, name: str, params: Any) -> Any:
                return self.tx.all(name, params)

            def many(self, name: str, params: Any) -> Any:
                return self.tx.many(name, params)

            def run(self, name: str, params: Any) -> Any:
                if name == "update_tracking" and outer.crash:
                    raise RuntimeError("runner killed mid-batch")
                return self.tx.run(name, params)

        return Wrapped()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_runner__killed_mid_batch_resumes_without_loss_or_double_count(
    runtime: Runtime,
) -> None:
    """A batch that dies before committing leaves views and position untouched; the next
    runner does the batch once."""
    scripted_mix(runtime)
    crashing = CrashingDialect(runtime.store)
    views = ReportingStore(crashing)
    with pytest.raises(RuntimeError, match="killed"):
        views.process_batch(7)
    assert runtime.views.position() == (0, 0)
    assert runtime.views.status_counts() == {}
    crashing.crash = False
    views.process_batch(7)
    assert runtime.views.position() > (0, 0)
    runtime.project(batch=5)
    assert sum(runtime.views.status_counts().values()) == 6
    assert runtime.verify() == []


def test_runner__concurrent_runners_take_turns(runtime: Runtime) -> None:
    """Several runners at once never fold an event twice."""
    scripted_mix(runtime)
    threads = [threading.Thread(target=runtime.project, kwargs={"batch": 3}) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(runtime.views.status_counts().values()) == 6
    assert runtime.verify() == []


def test_runner__notification_gaps_skip_nothing(runtime: Runtime) -> None:
    """Conflicting appends leave gaps in the ids (on PostgreSQL); every event is still folded."""
    run_id = runtime.enqueue("scripted", {"steps": 1})
    claimed = runtime.store.claim(holder="w", lease_ms=60_000, agents=["scripted"])
    assert claimed is not None
    for _ in range(3):
        zombie = runtime.store.load(run_id)
        assert zombie is not None
        claimed.run.record_step(kind="llm", name="x", duration_ms=1)
        runtime.store.append(claimed.run)
        zombie.record_step(kind="llm", name="stale", duration_ms=1)
        with pytest.raises(VersionConflict):
            runtime.store.append(zombie)
    claimed.run.complete()
    runtime.store.append(claimed.run)
    runtime.project(batch=2)
    summary = runtime.views.summary(run_id)
    assert summary is not None
    assert summary.steps == 3
    assert summary.state.status is RunStatus.COMPLETED
    assert runtime.verify() == []


def test_history__equals_the_events_appended(store: Any) -> None:
    """The trail of a run is exactly the events that were appended, in order."""
    run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
    appended = list(run.pending_events)
    store.create(run, request=b"{}")
    run = store.claim(holder="w", lease_ms=60_000, agents=["a"]).run
    appended.append(Run.Claimed(actor="w", lease_ms=60_000))
    for i in range(3):
        run.record_step(kind="llm", name=f"s{i}", duration_ms=i)
        appended.extend(run.pending_events)
        store.append(run)
    run.complete(result={"ok": True})
    appended.extend(run.pending_events)
    store.append(run)
    assert [h.event for h in store.history(run.id)] == appended


def test_audit__state_as_of_any_version(runtime: Runtime) -> None:
    """`audit --at V` is the fold of the first V events; other versions are refused."""
    run_id = runtime.enqueue("scripted", {"steps": 2})
    runtime.work(burst=True)
    trail = runtime.history(run_id)
    for version in range(1, len(trail) + 1):
        state, events = runtime.audit(run_id, version)
        assert len(events) == version
        assert state == fold(h.event for h in trail[:version])
    assert runtime.audit(run_id, 2)[0].status is RunStatus.RUNNING
    with pytest.raises(ValueError, match="versions 1 to"):
        runtime.audit(run_id, len(trail) + 1)


def test_snapshot__loading_a_long_run_replays_nothing(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with hundreds of steps loads from its index row without decoding one event."""
    run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
    store.create(run, request=b"{}")
    run = store.claim(holder="w", lease_ms=60_000, agents=["a"]).run
    for i in range(300):
        run.record_step(kind="llm", name=f"s{i}", duration_ms=1)
        store.append(run)
    decoded = Counter[str]()
    real = codec.decode_event

    def counting(topic: str, state: bytes, **where: str) -> Any:
        decoded[topic] += 1
        return real(topic, state, **where)

    # Every module that decodes a store's events (the stores' reads and bulk parts).
    for module in (codec, pg_reads, pg_bulk, sqlite_reads, sqlite_bulk):
        monkeypatch.setattr(module, "decode_event", counting)
    assert len(store.history(run.id)) == 302  # the counter does count decodes
    decoded.clear()
    loaded = store.load(run.id)
    assert loaded.state == run.state
    assert loaded.state.steps == 300
    assert sum(decoded.values()) == 0


def test_rebuild__reproduces_the_live_views(runtime: Runtime) -> None:
    """Dropping and rebuilding every view gives back exactly what was maintained live."""
    scripted_mix(runtime)
    runtime.project()
    before = (runtime.views.status_counts(), runtime.views.summaries(), runtime.store.all_rows())
    done = runtime.rebuild("all")
    assert done["run-index"] == 6
    after = (runtime.views.status_counts(), runtime.views.summaries(), runtime.store.all_rows())
    assert after[0] == before[0]
    assert {s.run_id for s in after[1]} == {s.run_id for s in before[1]}
    assert runtime.verify() == []
    with pytest.raises(ValueError, match="unknown view"):
        runtime.rebuild("nope")


# -- random lifecycles -------------------------------------------------------------------------

COMMANDS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "enqueue",
                "claim",
                "step",
                "write",
                "requeue",
                "reclaim",
                "suspend",
                "decide",
                "cancel",
                "complete",
                "fail",
                "dead_letter",
                "project",
            ]
        ),
        st.integers(min_value=0, max_value=3),
    ),
    min_size=5,
    max_size=40,
)


LIFECYCLE: dict[str, Any] = {
    "step": lambda run: run.record_step(kind="llm", name="s", duration_ms=5, tokens=3),
    "write": lambda run: run.mark_effect_pending(tool="t", effect=Effect.NON_IDEMPOTENT_WRITE),
    "requeue": lambda run: run.requeue(
        delay_ms=0, failure_class=FailureClass.SERVER_ERROR, error_type="E"
    ),
    "reclaim": lambda run: run.reclaim(actor="reaper"),
    "suspend": lambda run: run.suspend(
        kind=WaitKind.APPROVAL, digest="sha256:d", pending_tools=("t",)
    ),
    "decide": lambda run: (
        run.decide(by="p", kind=WaitKind.APPROVAL, approved=True, digest="sha256:d"),
        run.release(actor="p"),
    ),
    "cancel": lambda run: run.cancel(actor="op"),
    "complete": lambda run: run.complete(),
    "fail": lambda run: run.fail(reason=TerminationReason.POLICY_DENIED),
    "dead_letter": lambda run: run.dead_letter(
        actor="r", reason=TerminationReason.NOT_RETRYABLE, cause="t"
    ),
}


def apply_command(store: Any, runs: list[UUID], name: str, pick: int) -> None:
    """Apply one lifecycle command to a run, if it is legal; illegal ones change nothing."""
    if name == "enqueue" or not runs:
        run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
        store.create(run, request=b"{}")
        runs.append(run.id)
        return
    if name == "claim":
        store.claim(holder="w", lease_ms=60_000, agents=["a"])
        return
    run = store.load(runs[pick % len(runs)])
    try:
        LIFECYCLE[name](run)
    except IllegalTransition:
        return
    store.append(run, resumable=b"{}" if name == "suspend" else None)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(commands=COMMANDS)
def test_views__random_lifecycles_rebuild_equals_live(runtime: Runtime, commands: Any) -> None:
    """For random command sequences, with the runner interleaved, the live views and index
    always equal a rebuild from scratch."""
    runtime.project()
    runs: list[UUID] = []
    for name, pick in commands:
        if name == "project":
            runtime.views.process_batch(pick + 1)
        else:
            apply_command(runtime.store, runs, name, pick)
    runtime.project(batch=4)
    assert runtime.verify() == []


def test_runner__waits_for_a_lower_id_that_commits_later(pg_url: str) -> None:
    """PostgreSQL: an event whose transaction commits after a later-numbered one is still
    folded — the runner reads only transactions older than any still running."""
    import psycopg

    from tests.conftest import make_runtime

    rt = make_runtime(pg_url)
    try:
        slow = rt.store.load(rt.enqueue("scripted", {}))
        fast = rt.enqueue("scripted", {})
        rt.project()
        assert slow is not None
        slow.cancel(actor="slow-writer")
        params = rt.store.append_params(slow)  # type: ignore[union-attr]
        with psycopg.connect(pg_url) as conn:  # an open transaction: its id is taken now
            conn.execute(rt.store.q["append"], params)
            rt.cancel(fast, by="fast-writer")  # commits first, with a higher id
            rt.project()
            counts = rt.views.status_counts()
            assert counts.get(("scripted", "cancelled")) is None, "must wait for the slow one"
            conn.commit()
        rt.project()
        assert rt.views.status_counts() == {("scripted", "cancelled"): 2}
        assert rt.verify() == []
    finally:
        rt.close()


class PoisonedViews:
    """The real views, except that batches fail while `poisoned` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.poisoned = True
        self.failed_batches = 0

    def process_batch(self, limit: int = 1000) -> Any:
        if self.poisoned:
            self.failed_batches += 1
            raise ValueError("Queued cannot follow Completed")
        return self.inner.process_batch(limit)

    def record_failure(self, error: str) -> None:
        self.inner.record_failure(error)


def test_runner__poison_batch_is_reported_and_retried(runtime: Runtime) -> None:
    """A batch that keeps failing does not end the runner: it is recorded where operators
    look (failed batches, last error), retried, and cleared once a batch commits."""
    runtime.enqueue("scripted", {})
    views = PoisonedViews(runtime.views)
    stop = threading.Event()
    runner = threading.Thread(
        target=Projector(views, log=runtime.log).run_forever, args=(0.01, stop)
    )
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while views.failed_batches < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runner.is_alive()
        health = runtime.views.runner()
        assert health.failures >= 2
        assert health.last_error == "ValueError: Queued cannot follow Completed"
        views.poisoned = False
        while runtime.views.runner().failures and time.monotonic() < deadline + 10:
            time.sleep(0.02)
        assert runtime.views.runner().failures == 0
        assert runtime.views.runner().last_error is None
        assert runtime.views.status_counts() == {("scripted", "queued"): 1}
    finally:
        stop.set()
        runner.join(10)


def test_verify__no_false_drift_while_workers_write(store: Any) -> None:
    """`verify` reads the run index and the log in one snapshot: writers appending all the
    while never make it report drift."""
    from steptrail.workers import maintenance

    runs = []
    for _ in range(4):
        store.create(
            Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t"),
            request=b"{}",
        )
        claimed = store.claim(holder="worker:test", lease_ms=60_000, agents=["a"])
        runs.append(claimed.run)
    stop = threading.Event()

    def write(run: Run) -> None:
        while not stop.is_set():
            run.record_step(kind="llm", name="s", duration_ms=1)
            store.append(run)

    writers = [threading.Thread(target=write, args=(r,)) for r in runs]
    for w in writers:
        w.start()
    try:
        # Verify at least 15 times and until the writers have written meanwhile (a loaded
        # machine may schedule them late); bounded.
        reports = [maintenance.verify_index(store) for _ in range(15)]
        deadline = time.monotonic() + 30
        while (
            sum(len(store.history(r.id)) for r in runs) <= 4 * 2 + 15
            and time.monotonic() < deadline
        ):
            reports.append(maintenance.verify_index(store))
    finally:
        stop.set()
        for w in writers:
            w.join(10)
    assert sum(len(store.history(r.id)) for r in runs) > 4 * 2 + 15  # they did write
    assert reports == [[]] * len(reports)
