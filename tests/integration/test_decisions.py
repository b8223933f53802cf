"""People in the loop: suspend, approve, deny, input, cancel races — on both backends."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steptrail import App, RunContext
from steptrail.domain.enums import (
    Effect,
    FailureClass,
    Outcome,
    RunStatus,
    TerminationReason,
    WaitKind,
)
from steptrail.domain.errors import (
    CorruptResumableState,
    DigestMismatch,
    IllegalTransition,
    InvalidInput,
)
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
from steptrail.workers.decisions import AlreadyResuming
from tests.conftest import make_runtime

APPROVE_AT_2 = {"steps": 3, "approval": {"at": 2, "tools": ["send_email"]}}


def names(rt: Runtime, run_id: UUID) -> list[str]:
    return [type(h.event).__name__ for h in rt.history(run_id)]


def waiting_run(rt: Runtime, request: dict[str, Any] = APPROVE_AT_2) -> UUID:
    run_id = rt.enqueue("scripted", request)
    rt.work(burst=True)
    assert rt.get(run_id).status.is_waiting
    return run_id


def test_suspend__releases_lease_and_saves_state_verbatim(runtime: Runtime) -> None:
    """A suspended run holds no lease and keeps its pending calls verbatim beside the log."""
    run_id = waiting_run(runtime)
    row = runtime.get(run_id)
    assert row.status is RunStatus.WAITING_FOR_APPROVAL
    assert row.state.holder is None
    assert row.lease_expires_at is None
    saved = json.loads(runtime.store.saved(run_id, "resumable") or b"")
    assert saved["calls"] == [{"name": "send_email", "arguments": {"step": 2}, "id": None}]
    pending = runtime.pending(run_id)
    assert pending.digest == row.state.waiting.digest
    assert [c.name for c in pending.calls] == ["send_email"]


def test_approve__through_the_queue_to_completion(runtime: Runtime) -> None:
    """Approval is recorded before any tool runs; a worker resumes and runs the write."""
    run_id = waiting_run(runtime)
    digest = runtime.pending(run_id).digest
    result = runtime.approve(run_id, by="alice", digest=digest)
    assert (result.outcome, result.status) == (Outcome.REQUEUED, RunStatus.QUEUED)
    runtime.work(burst=True)
    trail = names(runtime, run_id)
    assert runtime.get(run_id).status is RunStatus.COMPLETED
    decided = trail.index("Decided")
    assert trail[decided : decided + 2] == ["Decided", "Released"]
    assert trail.index("EffectPending") > decided
    event = next(h.event for h in runtime.history(run_id) if isinstance(h.event, Run.Decided))
    assert (event.approved, event.actor) == (True, "alice")
    assert runtime.store.saved(run_id, "resumable") is None


def test_approve__interactive_run_resumes_here_under_resume_lease(runtime: Runtime) -> None:
    """An interactive run is resumed in the approver's process under a `resume:` lease."""
    started = runtime.start("scripted", APPROVE_AT_2)
    assert started.outcome is Outcome.AWAITING_APPROVAL
    result = runtime.approve(started.run_id, by="alice")
    assert result.outcome is Outcome.COMPLETED
    resumed = next(
        h.event for h in runtime.history(started.run_id) if isinstance(h.event, Run.Resumed)
    )
    assert resumed.actor.startswith("resume:")


def test_deny__calls_get_error_results_and_the_agent_continues(runtime: Runtime) -> None:
    """Denied calls never run; each gets the denial as its result and the run goes on."""
    run_id = waiting_run(runtime)
    result = runtime.deny(run_id, by="bob", resume="here")
    assert result.outcome is Outcome.COMPLETED
    trail = runtime.history(run_id)
    assert not any(isinstance(h.event, Run.EffectPending) for h in trail)
    decided = next(h.event for h in trail if isinstance(h.event, Run.Decided))
    assert decided.approved is False
    after = [h.event for h in trail if isinstance(h.event, Run.StepRecorded)]
    # think-1 is replayed on the resumed segment, not recorded again; taking the decision
    # is a step of its own (ADR 0015).
    assert [s.name for s in after] == ["think-1", "approval", "send_email", "think-2", "think-3"]
    assert after[1].kind == "decision"


def test_digest__mismatch_refused_and_run_stays_waiting(runtime: Runtime) -> None:
    """A decision quoting other calls' digest is refused and records nothing."""
    run_id = waiting_run(runtime)
    before = names(runtime, run_id)
    with pytest.raises(DigestMismatch):
        runtime.approve(run_id, by="alice", digest="sha256:" + "0" * 64)
    assert names(runtime, run_id) == before
    assert runtime.get(run_id).status is RunStatus.WAITING_FOR_APPROVAL


def test_approve__two_at_once_exactly_one_resumes(runtime: Runtime) -> None:
    """Two approvers racing: one resumes the run, the other is told it is already resuming."""
    run_id = waiting_run(runtime)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def approve(who: str) -> None:
        barrier.wait()
        try:
            runtime.approve(run_id, by=who, resume="queue")
            outcomes.append("resumed")
        except AlreadyResuming:
            outcomes.append("already resuming")

    threads = [threading.Thread(target=approve, args=(w,)) for w in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["already resuming", "resumed"]
    assert names(runtime, run_id).count("Decided") == 1
    with pytest.raises(AlreadyResuming):
        runtime.approve(run_id, by="carol")


def test_cancel__waiting_run_drops_state_and_refuses_decisions(runtime: Runtime) -> None:
    """Cancelling a waiting run drops its resumable state and saved request; deciding fails."""
    run_id = waiting_run(runtime)
    runtime.cancel(run_id, by="op")
    assert runtime.store.saved(run_id, "resumable") is None
    assert runtime.store.saved(run_id, "request") is None
    with pytest.raises(IllegalTransition):
        runtime.approve(run_id, by="alice")


def test_cancel__racing_a_suspend_ends_suspend_failed(db_url: str) -> None:
    """A cancel that lands just before the suspend wins; the segment reports suspend_failed."""
    entered, release = threading.Event(), threading.Event()
    app = App()

    @app.agent("asker")
    def asker(ctx: RunContext, request: dict[str, Any]) -> None:
        entered.set()
        assert release.wait(10)
        ctx.request_approval([{"name": "send_email"}], conversation=["hi"])

    rt = make_runtime(db_url, app=app)
    try:
        run_id = rt.enqueue("asker", {})
        results: list[Any] = []
        worker = threading.Thread(
            target=lambda: rt.worker(burst=True, on_result=results.append).run()
        )
        worker.start()
        assert entered.wait(10)
        rt.cancel(run_id, by="op")
        release.set()
        worker.join(10)
        assert [r.outcome for r in results] == [Outcome.SUSPEND_FAILED]
        assert rt.get(run_id).status is RunStatus.CANCELLED
        assert "Suspended" not in names(rt, run_id)
        assert rt.store.saved(run_id, "resumable") is None
    finally:
        rt.close()


INPUT_AT_2 = {"steps": 2, "input": {"at": 2}}


def test_input__invalid_values_refused_before_anything_changes(runtime: Runtime) -> None:
    """Input that fails the declared schema is refused; the run keeps waiting."""
    run_id = waiting_run(runtime, INPUT_AT_2)
    before = names(runtime, run_id)
    with pytest.raises(InvalidInput):
        runtime.submit_input(run_id, {"account": ""}, by="alice")
    with pytest.raises(InvalidInput):
        runtime.submit_input(run_id, {"other": "x"}, by="alice")
    assert names(runtime, run_id) == before
    assert runtime.get(run_id).status is RunStatus.WAITING_FOR_INPUT


def test_input__declared_keys_taken_values_never_logged(runtime: Runtime) -> None:
    """Valid input resumes the run; the event names who and which keys, never the values."""
    run_id = waiting_run(runtime, INPUT_AT_2)
    runtime.submit_input(run_id, {"account": "acme-secret-123", "extra": 1}, by="alice")
    runtime.work(burst=True)
    assert runtime.get(run_id).status is RunStatus.COMPLETED
    trail = runtime.history(run_id)
    decided = next(h.event for h in trail if isinstance(h.event, Run.Decided))
    assert (decided.actor, decided.input_keys) == ("alice", ("account",))
    dumped = json.dumps([h.event.model_dump(mode="json") for h in trail])
    assert "acme-secret-123" not in dumped


def test_suspend_again__counters_carry_over(runtime: Runtime) -> None:
    """A resumed run may suspend again; iterations and tokens keep counting."""
    run_id = waiting_run(runtime, {"steps": 4, "approval": {"at": [2, 4]}})
    first = runtime.get(run_id).state
    runtime.approve(run_id, by="alice", resume="here")
    second = runtime.get(run_id).state
    assert second.status is RunStatus.WAITING_FOR_APPROVAL
    assert second.tokens > first.tokens
    assert second.iterations > first.iterations
    runtime.approve(run_id, by="alice", resume="here")
    final = runtime.get(run_id).state
    assert final.status is RunStatus.COMPLETED
    assert names(runtime, run_id).count("Suspended") == 2
    assert final.iterations == 4


def test_corrupt_resumable_state__refused_before_anything_changes(runtime: Runtime) -> None:
    """Unreadable resumable state is refused; the log is unchanged and the run still waits."""
    run_id = waiting_run(runtime)
    before = names(runtime, run_id)
    _overwrite_resumable(runtime, run_id, b"{not json")
    with pytest.raises(CorruptResumableState):
        runtime.approve(run_id, by="alice")
    _overwrite_resumable(runtime, run_id, b'{"kind": "approval", "calls": [{"name": "rm -rf"}]}')
    with pytest.raises(CorruptResumableState):
        runtime.approve(run_id, by="alice")
    assert names(runtime, run_id) == before


def test_queue_resume__calls_altered_after_approval_never_run(runtime: Runtime) -> None:
    """Calls changed in the database after the approval, before a worker resumes the run,
    do not run: the worker re-checks the decision's digest and dead-letters the run."""
    run_id = waiting_run(runtime)
    runtime.approve(run_id, by="alice", digest=runtime.pending(run_id).digest)
    altered = {"kind": "approval", "calls": [{"name": "send_email", "arguments": {"to": "eve"}}]}
    _overwrite_resumable(runtime, run_id, json.dumps(altered).encode())
    report = runtime.work(burst=True)
    assert report.outcomes == {"failed": 1}
    row = runtime.get(run_id)
    assert (row.status, row.state.reason) == (RunStatus.FAILED, TerminationReason.NOT_RETRYABLE)
    trail = names(runtime, run_id)
    assert "EffectPending" not in trail[trail.index("Decided") :]
    assert runtime.history(run_id)[-1].event.cause == "resumable_state_mismatch"
    assert runtime.store.saved(run_id, "resumable") is None


def _overwrite_resumable(rt: Runtime, run_id: UUID, body: bytes) -> None:
    """Corrupt the saved state directly in the database (what a bad restore might do)."""
    store: Any = rt.store
    if store.backend == "sqlite":
        with store._write() as (cur, _):
            cur.execute(
                "UPDATE steptrail_saved SET body = ? WHERE run_id = ? AND kind = 'resumable'",
                (body, run_id.hex),
            )
    else:
        with store._connection() as conn:
            conn.execute(
                "UPDATE steptrail_saved SET body = %s WHERE run_id = %s AND kind = 'resumable'",
                (body, run_id),
            )


SETTLE = st.sampled_from(["complete", "fail", "cancel", "dead_letter"])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    suspend=st.booleans(),
    decide=st.sampled_from([None, "resume", "release"]),
    write=st.booleans(),
    settle=SETTLE,
)
def test_settle__clears_resumable_state_and_keeps_only_a_failed_runs_request(
    store: Any, suspend: bool, decide: str | None, write: bool, settle: str
) -> None:
    """Whatever path a run took, settling it leaves no resumable state, and no saved request
    unless it failed: a failed run keeps its request for a retry until purge (ADR 0025)."""
    run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
    store.create(run, request=b'{"prompt": "hello"}')
    run = store.claim(holder="w", lease_ms=60_000, agents=["a"]).run
    if write:
        run.mark_effect_pending(tool="send", effect=Effect.NON_IDEMPOTENT_WRITE)
        store.append(run)
    if suspend:
        run.suspend(kind=WaitKind.APPROVAL, digest="sha256:d", pending_tools=("send",))
        store.append(run, resumable=b'{"conversation": ["hi"]}')
        if decide is not None:
            run.decide(by="p", kind=WaitKind.APPROVAL, approved=True, digest="sha256:d")
            if decide == "resume":
                run.resume(holder="resume:x", lease_ms=60_000)
            else:
                run.release(actor="p")
            store.append(run)
            if run.status is RunStatus.QUEUED:
                run = store.claim(holder="w2", lease_ms=60_000, agents=["a"]).run
    if settle == "cancel" or run.status is not RunStatus.RUNNING:
        run.cancel(actor="op")
    elif settle == "complete":
        run.complete()
    elif settle == "fail":
        run.fail(reason=TerminationReason.POLICY_DENIED, failure_class=FailureClass.AUTH)
    else:
        run.dead_letter(actor="w", reason=TerminationReason.NOT_RETRYABLE, cause="t")
    store.append(run)
    state = store.load(run.id).state
    assert state.status.is_terminal
    assert (state.has_saved_request, state.has_resumable_state) == (False, False)
    kept = store.saved(run.id, "request")
    assert kept == (b'{"prompt": "hello"}' if state.status is RunStatus.FAILED else None)
    assert store.saved(run.id, "resumable") is None
    assert bool(state.pending_effects) is write
