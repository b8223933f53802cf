"""Durable execution end to end on both backends: replay after retries, reclaims and
decisions, writes never repeated, code changes refused, deadlines, the journal's lifetime."""

from __future__ import annotations

import contextvars
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from steptrail import App, RunContext
from steptrail.domain.enums import FailureClass, Outcome, RunStatus, TerminationReason
from steptrail.domain.errors import StoreUnavailable
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
from steptrail.testing import Kit
from tests.conftest import FAST, make_runtime
from tests.integration.test_worker import Gate, run_in_thread


@pytest.fixture
def steptrail_database_url(db_url: str) -> str:
    """Tests here that use the testing kit run on both backends."""
    return db_url


@pytest.fixture
def steptrail_settings() -> dict[str, Any]:
    return dict(FAST)


def executions(witness: Path, run_id: UUID) -> Counter[int]:
    """How many times each scripted step really ran, as its witness file tells."""
    path = witness / str(run_id)
    if not path.exists():
        return Counter()
    return Counter(int(line) for line in path.read_text().split())


def events(rt: Runtime, run_id: UUID) -> list[Any]:
    return [h.event for h in rt.history(run_id)]


def work_until_settled(rt: Runtime, run_id: UUID, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not rt.get(run_id).status.is_terminal:
        rt.work(burst=True)
        time.sleep(0.02)


def test_retry__recorded_steps_are_replayed_not_rerun(steptrail_kit: Kit, tmp_path: Path) -> None:
    """After a transient failure at step 3 the retry replays steps 1-2 from the journal: they
    ran once, are counted once in steps and tokens, and the trail says what was replayed."""
    result = steptrail_kit.run_to_end(
        "scripted",
        {
            "steps": 4,
            "fail": {"class": "server_error", "at": 3, "times": 1},
            "witness": str(tmp_path),
        },
    )
    assert result.status is RunStatus.COMPLETED
    assert executions(tmp_path, result.run_id) == {1: 1, 2: 1, 3: 2, 4: 1}
    assert [(s.name, s.error_type) for s in result.steps] == [
        ("think-1", None),
        ("think-2", None),
        ("think-3", "HttpStatusError"),
        ("think-3", None),
        ("think-4", None),
    ]
    assert result.row.state.tokens == 40  # four successful model calls, none counted twice
    trail = result.events
    replayed = [e for e in trail if isinstance(e, Run.Replayed)]
    assert [(r.count, r.last_seq) for r in replayed] == [(2, 2)]
    requeued = next(i for i, e in enumerate(trail) if isinstance(e, Run.Requeued))
    assert trail.index(replayed[0]) > requeued
    assert result.journal == []


def test_duplicate_email__recorded_write_is_not_sent_again(
    steptrail_kit: Kit, tmp_path: Path
) -> None:
    """The issue's scenario: send_email (non-idempotent) at step 2, a 503 at step 3, a
    requeue: the run completes having sent exactly one e-mail."""
    result = steptrail_kit.run_to_end(
        "scripted",
        {
            "steps": 3,
            "tool": {"effect": "non_idempotent_write", "at": 2},
            "fail": {"class": "server_error", "at": 3, "times": 1},
            "witness": str(tmp_path),
        },
    )
    assert result.status is RunStatus.COMPLETED
    assert executions(tmp_path, result.run_id)[2] == 1
    assert sum(isinstance(e, Run.EffectPending) for e in result.events) == 1
    assert [s.name for s in result.steps].count("send_email") == 1
    assert result.row.state.pending_effects == ()


def write_then_block_app(gate: Gate, sent: list[str]) -> App:
    app = App()
    app.tool("send_email", effect="non_idempotent_write")

    @app.agent("mailer")
    def mailer(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("draft", lambda: "hello")
        ctx.tool("send_email", lambda: sent.append(ctx.fencing_token) or "sent", arguments={})
        first = ctx.attempt == 1
        ctx.llm("wait", lambda: gate.wait() if first else "fast")
        ctx.llm("wrap-up", lambda: "done")
        return {}

    return app


def test_reclaim__write_recorded_before_the_takeover_is_not_sent_again(db_url: str) -> None:
    """A worker stalls after its write was recorded; the run is reclaimed and finished by
    another worker, which replays the write instead of sending again; the stalled worker,
    released, records nothing."""
    gate, sent = Gate(), []
    rt = make_runtime(db_url, app=write_then_block_app(gate, sent))
    try:
        run_id = rt.enqueue("mailer", {})
        results: list[Any] = []
        thread = run_in_thread(rt, results)
        assert gate.entered.wait(10)
        stale = rt.store.load(run_id)
        assert stale is not None
        stale.reclaim(actor="reaper:test")
        rt.store.append(stale)
        rescue = rt.work(burst=True)
        assert rescue.outcomes == {"completed": 1}
        gate.release.set()
        thread.join(10)
        assert [r.outcome for r in results] == [Outcome.LEASE_LOST]
        assert len(sent) == 1
        trail = events(rt, run_id)
        assert [e.count for e in trail if isinstance(e, Run.Replayed)] == [2]
        assert rt.get(run_id).status is RunStatus.COMPLETED
    finally:
        rt.close()


def changing_app(version: dict[str, int], seen: list[Any]) -> App:
    app = App()

    @app.agent("changing")
    def changing(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        name = "plan" if version["v"] == 1 else "plan-v2"
        seen.append(ctx.llm(name, lambda: f"{name} result"))
        if version["v"] == 1:
            raise ConnectionError("provider went away")  # transient: the run is requeued
        seen.append(ctx.llm("act", lambda: "acted"))
        return {}

    return app


def test_code_change__run_fails_non_deterministic_with_nothing_replayed(db_url: str) -> None:
    """The agent's code changes between segments: the retry finds another step at position
    1 than the journal recorded, and the run dead-letters non_deterministic without the
    agent ever receiving the recorded result."""
    version, seen = {"v": 1}, []
    # A retry delay long enough that the first burst ends before the retry is due.
    rt = make_runtime(db_url, app=changing_app(version, seen), retry_base_seconds=0.5)
    try:
        run_id = rt.enqueue("changing", {})
        rt.work(burst=True)
        assert rt.get(run_id).status is RunStatus.QUEUED
        version["v"] = 2
        work_until_settled(rt, run_id)
        row = rt.get(run_id)
        assert row.status is RunStatus.FAILED
        assert row.state.reason is TerminationReason.NOT_RETRYABLE
        assert row.state.failure_class is FailureClass.NON_DETERMINISTIC
        assert seen == ["plan result"]  # the second segment got nothing, right or wrong
        dead = next(e for e in events(rt, run_id) if isinstance(e, Run.DeadLettered))
        assert "step 1" in dead.cause
        assert "'plan'" in dead.cause
        assert "'plan-v2'" in dead.cause
        # A failed run keeps its journal for a retry (ADR 0070): the recorded step only.
        assert [e.name for e in rt.store.journal(run_id)] == ["plan"]
    finally:
        rt.close()


def test_code_change__swallowed_mismatch_still_fails_the_run(db_url: str) -> None:
    """An agent that catches the mismatch and returns cannot complete the run."""
    version = {"v": 1}
    app = App()

    @app.agent("swallower")
    def swallower(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        try:
            ctx.llm("a" if version["v"] == 1 else "b", lambda: 1)
        except Exception:  # the point of the test
            return {"ok": True}
        if version["v"] == 1:
            raise ConnectionError("again")
        return {}

    rt = make_runtime(db_url, app=app, retry_base_seconds=0.5)
    try:
        run_id = rt.enqueue("swallower", {})
        rt.work(burst=True)
        version["v"] = 2
        work_until_settled(rt, run_id)
        assert rt.get(run_id).state.failure_class is FailureClass.NON_DETERMINISTIC
    finally:
        rt.close()


@pytest.mark.parametrize("mode", ["queue", "here"])
def test_approval__resume_replays_and_returns_the_decision(
    runtime: Runtime, tmp_path: Path, mode: str
) -> None:
    """The model call before the approval is not called again after `approve`: the resumed
    segment replays it and `request_approval` returns the decision."""
    run_id = runtime.enqueue(
        "scripted",
        {"steps": 3, "approval": {"at": 2, "tools": ["send_email"]}, "witness": str(tmp_path)},
    )
    runtime.work(burst=True)
    assert runtime.get(run_id).status is RunStatus.WAITING_FOR_APPROVAL
    result = runtime.approve(run_id, by="alice", resume=mode)  # type: ignore[arg-type]
    if mode == "queue":
        runtime.work(burst=True)
    else:
        assert result.outcome is Outcome.COMPLETED
    assert runtime.get(run_id).status is RunStatus.COMPLETED
    assert executions(tmp_path, run_id) == {1: 1, 2: 1, 3: 1}
    steps = [e for e in events(runtime, run_id) if isinstance(e, Run.StepRecorded)]
    assert [s.name for s in steps] == ["think-1", "approval", "send_email", "think-2", "think-3"]
    assert [e.count for e in events(runtime, run_id) if isinstance(e, Run.Replayed)] == [1]


def test_input__request_input_returns_the_validated_values(steptrail_kit: Kit) -> None:
    """`request_input` returns the submitted values on the resumed segment."""
    got: list[Any] = []
    app = App()

    @app.agent("asker")
    def asker(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("think", lambda: "hm")
        values = ctx.request_input(
            {"type": "object", "properties": {"account": {"type": "string"}}}
        )
        got.append(values)
        return {}

    steptrail_kit.runtime.app.include(app)
    result = steptrail_kit.run_to_end("asker", decide={"account": "acme", "junk": 1})
    assert got == [{"account": "acme"}]
    assert result.status is RunStatus.COMPLETED


def test_approval__resume_by_hand_with_ctx_resumed_still_works(runtime: Runtime) -> None:
    """An agent that reads `ctx.resumed` first and skips its earlier steps by hand resumes
    as before: no replay, no mismatch."""
    calls: list[str] = []
    app = App()
    app.tool("send_email", effect="non_idempotent_write")

    @app.agent("by_hand")
    def by_hand(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        if ctx.resumed is None:
            ctx.llm("draft", lambda: calls.append("draft") or "d")
            ctx.request_approval([{"name": "send_email", "arguments": {}}])
        ctx.run_pending({"send_email": lambda: calls.append("send") or "sent"})
        ctx.llm("after", lambda: calls.append("after") or "a")
        return {}

    runtime.app.include(app)
    run_id = runtime.enqueue("by_hand", {})
    runtime.work(burst=True)
    runtime.approve(run_id, by="alice", resume="here")
    assert calls == ["draft", "send", "after"]
    assert runtime.get(run_id).status is RunStatus.COMPLETED


def test_hung_step__times_out_and_the_retry_ladder_finishes_the_run(db_url: str) -> None:
    """A step sleeping far past its timeout fails `timeout` (retryable) at the deadline;
    the run is requeued and the retry completes it: never left running."""
    rt = make_runtime(db_url)
    try:
        run_id = rt.enqueue(
            "scripted",
            {"steps": 2, "hang": {"at": 1, "seconds": 60, "times": 1}, "timeout": 0.5},
        )
        started = time.monotonic()
        work_until_settled(rt, run_id, timeout=30)
        assert time.monotonic() - started < 20
        row = rt.get(run_id)
        assert row.status is RunStatus.COMPLETED
        requeued = [e for e in events(rt, run_id) if isinstance(e, Run.Requeued)]
        assert [(r.failure_class, r.error_type) for r in requeued] == [
            (FailureClass.TIMEOUT, "StepTimedOut")
        ]
    finally:
        rt.close()


def test_tool_timeout__declared_default_applies(db_url: str) -> None:
    """A tool's declared timeout is its calls' deadline; past it the run goes to the ladder."""
    app = App()
    app.tool("slow_lookup", timeout=0.3)

    @app.agent("looker", max_duration=None)
    def looker(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.tool("slow_lookup", lambda: time.sleep(5 if ctx.attempt == 1 else 0) or "x")
        return {}

    rt = make_runtime(db_url, app=app)
    try:
        run_id = rt.enqueue("looker", {})
        work_until_settled(rt, run_id)
        trail = events(rt, run_id)
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert [e.failure_class for e in trail if isinstance(e, Run.Requeued)] == ["timeout"]
    finally:
        rt.close()


def test_max_duration__stuck_agent_stops_renewing_and_is_reclaimed(db_url: str) -> None:
    """An agent stuck in its own code (not in a step) past its `max_duration` stops having
    its lease renewed: the reaper reclaims it, another segment finishes the run, and the
    stuck segment's later appends are fenced."""
    release = threading.Event()
    app = App()

    @app.agent("stuck", max_duration=0.5)
    def stuck(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("first", lambda: 1)
        if ctx.attempt == 1:
            release.wait(20)  # hung outside any step: only the lease can end this
        ctx.llm("second", lambda: 2)
        return {}

    rt = make_runtime(db_url, app=app, lease_seconds=0.6)
    try:
        run_id = rt.enqueue("stuck", {})
        results: list[Any] = []
        thread = run_in_thread(rt, results)
        deadline = time.monotonic() + 15
        reclaimed = False
        while time.monotonic() < deadline and not reclaimed:
            reclaimed = rt.reap().requeued == 1
            time.sleep(0.1)
        assert reclaimed, "the lease should have expired once the keeper stopped renewing"
        assert rt.work(burst=True).outcomes == {"completed": 1}
        release.set()
        thread.join(10)
        assert [r.outcome for r in results] == [Outcome.LEASE_LOST]
        trail = events(rt, run_id)
        assert isinstance(trail[-1], Run.Completed)
        assert [e.count for e in trail if isinstance(e, Run.Replayed)] == [1]
    finally:
        release.set()
        rt.close()


def test_idempotency_key__stable_across_executions(db_url: str) -> None:
    """An idempotent write whose worker died before its result was recorded runs again on
    the next segment with the same `ctx.idempotency_key`; the fencing token differs."""
    gate = Gate()
    keys: list[tuple[str, str]] = []
    app = App()
    app.tool("upsert", effect="idempotent_write")

    @app.agent("upserter")
    def upserter(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("plan", lambda: "p")

        def write() -> str:
            keys.append((ctx.idempotency_key, ctx.fencing_token))
            if len(keys) == 1:
                gate.wait()  # the first execution stalls inside the write
            return "ok"

        ctx.tool("upsert", write, arguments={"id": 7})
        return {}

    rt = make_runtime(db_url, app=app)
    try:
        run_id = rt.enqueue("upserter", {})
        results: list[Any] = []
        thread = run_in_thread(rt, results)
        assert gate.entered.wait(10)
        stale = rt.store.load(run_id)
        assert stale is not None
        assert [p.tool for p in stale.state.pending_effects] == ["upsert"]
        stale.reclaim(actor="reaper:test")
        rt.store.append(stale)
        assert rt.work(burst=True).outcomes == {"completed": 1}
        gate.release.set()
        thread.join(10)
        assert len(keys) == 2
        assert keys[0][0] == keys[1][0] == f"{run_id}:2"
        assert keys[0][1] != keys[1][1]
    finally:
        rt.close()


def test_journal__kept_while_waiting_and_deleted_on_settle(runtime: Runtime) -> None:
    """A waiting run keeps its journal verbatim (whatever the privacy level); settling
    deletes it in the same transaction."""
    run_id = runtime.enqueue("scripted", {"steps": 2, "approval": {"at": 2}})
    runtime.work(burst=True)
    journal = runtime.store.journal(run_id)
    assert [(e.seq, e.name, e.value) for e in journal] == [(1, "think-1", "thought 1")]
    step = next(e for e in events(runtime, run_id) if isinstance(e, Run.StepRecorded))
    assert "thought 1" not in str(step.payload)  # metadata level: the log has no content
    runtime.cancel(run_id, by="op")
    assert runtime.store.journal(run_id) == []


def test_timed_step__its_own_error_and_context_reach_the_agent(db_url: str) -> None:
    """A step run on a helper thread (it has a deadline) raises its own exception in the
    agent's thread, recorded with its class, and sees the caller's context variables."""
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    seen: list[str] = []
    app = App()

    @app.agent("flaky", step_timeout=5)
    def flaky(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        request_id.set("req-7")

        def call() -> str:
            seen.append(request_id.get())
            if ctx.attempt == 1:
                raise ConnectionError("reset")
            return "ok"

        ctx.llm("call", call)
        return {}

    rt = make_runtime(db_url, app=app)
    try:
        run_id = rt.enqueue("flaky", {})
        work_until_settled(rt, run_id)
        trail = events(rt, run_id)
        assert rt.get(run_id).status is RunStatus.COMPLETED
        steps = [e.error_type for e in trail if isinstance(e, Run.StepRecorded)]
        assert steps == ["ConnectionError", None]
        assert [e.failure_class for e in trail if isinstance(e, Run.Requeued)] == ["connection"]
        assert seen == ["req-7", "req-7"]
    finally:
        rt.close()


def test_journal_unreadable__segment_does_not_start(db_url: str) -> None:
    """A segment that cannot read its run's journal does not call the agent (it would run
    recorded steps again); the run is left for the reaper. (A PostgreSQL claim brings the
    journal along, ADR 0086; here its claims come without one, as a settle's chained claim
    does, so the segment reads it itself.)"""
    calls: list[int] = []
    app = App()

    @app.agent("counted")
    def counted(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("one", lambda: calls.append(1) or 1)
        if ctx.attempt == 1:
            raise ConnectionError("again")
        return {}

    rt = make_runtime(db_url, app=app, retry_base_seconds=0.3)
    try:
        run_id = rt.enqueue("counted", {})
        rt.work(burst=True)
        assert rt.get(run_id).status is RunStatus.QUEUED
        store = rt.store

        class Unreadable:
            def journal(self, run_id: UUID) -> Any:
                raise StoreUnavailable("connection refused")

            def claim_batch(self, **kwargs: Any) -> Any:
                return [replace(c, journal=None) for c in store.claim_batch(**kwargs)]

            def __getattr__(self, name: str) -> Any:
                return getattr(store, name)

        rt.store = Unreadable()  # type: ignore[assignment]
        outcomes: Counter[str] = Counter()
        deadline = time.monotonic() + 10
        while not outcomes and time.monotonic() < deadline:  # until the retry is due
            outcomes = rt.work(burst=True).outcomes
            time.sleep(0.05)
        assert outcomes == {"lease_lost": 1}
        assert calls == [1]
        rt.store = store
        assert rt.get(run_id).status is RunStatus.RUNNING
    finally:
        rt.close()


def test_step_name_with_a_nul__refused_before_it_runs_on_both_backends(db_url: str) -> None:
    """A step name with a NUL character is refused at the call, before the step runs, the
    same on both backends (PostgreSQL cannot keep it; it used to dead-letter the run only
    there, after the step had run, with a DataError from the journal's insert)."""
    ran: list[str] = []
    app = App()

    @app.agent("nul")
    def agent(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("first", lambda: ran.append("first"))
        try:
            ctx.llm("bad\x00name", lambda: ran.append("bad"))
        except ValueError as error:
            ran.append(f"refused: {error}")
        return {}

    rt = make_runtime(db_url, app=app)
    try:
        run_id = rt.enqueue("nul", {})
        assert rt.work(burst=True).outcomes == {"completed": 1}
        assert ran[0] == "first"
        assert ran[1].startswith("refused: a llm step's name cannot hold a NUL character")
        assert len(ran) == 2
        assert rt.get(run_id).status is RunStatus.COMPLETED
    finally:
        rt.close()
