"""`retry`: a failed run goes back on the queue through its log, on both backends."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from steptrail import App, RunContext
from steptrail.domain.classifier import ClassifiedError
from steptrail.domain.enums import Effect, FailureClass, RetryMode, RunStatus, TerminationReason
from steptrail.domain.errors import IllegalTransition, PendingWrite, UnknownRun
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
from tests.conftest import make_runtime
from tests.console_helpers import caught_up


@pytest.fixture
def flaky() -> dict[str, bool]:
    return {"fail": True}


@pytest.fixture
def rt(db_url: str, flaky: dict[str, bool]) -> Iterator[Runtime]:
    """A runtime with an agent that fails for good (auth) while `flaky["fail"]` is set."""
    app = App()

    @app.agent("flaky")
    def flaky_agent(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.step("llm", "think", lambda: {"n": request.get("n", 0)})
        if flaky["fail"]:
            raise ClassifiedError(FailureClass.AUTH, "key revoked")
        return {"ok": True}

    runtime = make_runtime(db_url, app=app)
    yield runtime
    runtime.close()


def topics(rt: Runtime, run_id: UUID) -> list[str]:
    return [type(h.event).__name__ for h in rt.history(run_id)]


def dead(rt: Runtime, n: int = 0) -> UUID:
    run_id = rt.enqueue("flaky", {"n": n})
    rt.work(burst=True)
    row = rt.get(run_id)
    assert (row.status, row.state.reason) == (RunStatus.FAILED, TerminationReason.NOT_RETRYABLE)
    return run_id


def test_retry__dead_letter_runs_again_and_completes(rt: Runtime, flaky: dict[str, bool]) -> None:
    """A dead-lettered run, retried, is claimed again with its kept request and completes."""
    run_id = dead(rt, n=7)
    assert rt.store.saved(run_id, "request") == b'{"n":7}'
    flaky["fail"] = False
    row = rt.retry(run_id, by="alice")
    assert row.status is RunStatus.QUEUED
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.COMPLETED
    trail = rt.history(run_id)
    retried = [h.event for h in trail if isinstance(h.event, Run.Retried)]
    assert [(e.actor, e.forced, e.reset_budget) for e in retried] == [("alice", False, False)]
    # The step the run recorded replays from its kept journal (ADR 0070); completing drops it.
    assert topics(rt, run_id)[-4:] == ["Retried", "Claimed", "Replayed", "Completed"]
    assert (retried[0].mode, retried[0].position) == (RetryMode.RESUME, 2)
    assert rt.store.saved(run_id, "request") is None
    assert rt.store.journal(run_id) == []


def test_retry__views_follow_the_run_back_to_the_queue(rt: Runtime) -> None:
    """The reporting views count the retried run as queued and it is no longer ended."""
    run_id = dead(rt)
    caught_up(rt)
    rt.retry(run_id, by="alice")
    caught_up(rt)
    summary = rt.views.summary(run_id)
    assert summary is not None
    assert (summary.state.status, summary.ended_at) == (RunStatus.QUEUED, None)
    assert rt.views.status_counts()[("flaky", "queued")] == 1
    assert rt.verify() == []


def test_retry__refused_for_a_run_that_is_not_failed(rt: Runtime) -> None:
    """Queued, completed or unknown runs are refused with a clear error; nothing is written."""
    queued = rt.enqueue("flaky", {})
    with pytest.raises(IllegalTransition, match="only a failed run"):
        rt.retry(queued, by="alice")
    assert topics(rt, queued) == ["Queued"]
    with pytest.raises(UnknownRun):
        rt.retry(uuid.uuid4(), by="alice")


def test_retry__pending_non_idempotent_write_needs_force(rt: Runtime) -> None:
    """A run that failed with a write pending is refused unless forced; force is recorded."""
    run_id = rt.enqueue("flaky", {})
    run = rt.store.claim(holder="worker:t:1:x", lease_ms=60_000, agents=["flaky"])
    assert run is not None
    r = run.run
    r.mark_effect_pending(tool="charge_card", effect=Effect.NON_IDEMPOTENT_WRITE)
    r.dead_letter(actor="worker:t:1:x", reason=TerminationReason.NOT_RETRYABLE, cause="write")
    rt.store.append(r)
    with pytest.raises(PendingWrite, match="charge_card"):
        rt.retry(run_id, by="alice")
    assert topics(rt, run_id)[-1] == "DeadLettered"
    rt.retry(run_id, by="alice", force=True, reset_budget=True)
    last = rt.history(run_id)[-1].event
    assert isinstance(last, Run.Retried)
    assert (last.forced, last.reset_budget, last.cleared_tools) == (True, True, ("charge_card",))
    assert rt.get(run_id).state.pending_effects == ()


def test_retry__interactive_run_has_no_request_to_run_again(rt: Runtime) -> None:
    """A failed interactive run has no saved request, so a retry is refused clearly."""
    result = rt.start("flaky", {})
    assert rt.get(result.run_id).status is RunStatus.FAILED
    with pytest.raises(IllegalTransition, match="no saved request"):
        rt.retry(result.run_id, by="alice")
    # Nothing can resume it, so it keeps no journal either: kept exactly with a request.
    assert rt.get(result.run_id).state.steps == 1
    assert rt.store.journal(result.run_id) == []


def test_retry_many__by_agent_reason_and_since(rt: Runtime) -> None:
    """Bulk retry takes the matching failed runs only, and reports the refused ones."""
    first, second = dead(rt), dead(rt)
    other = rt.enqueue("flaky", {})
    report = rt.retry_many(
        by="bob", agent="flaky", reason="not_retryable", since=datetime.now(UTC) - timedelta(1)
    )
    assert sorted(report.retried) == sorted([first, second])
    assert report.refused == []
    assert rt.get(other).status is RunStatus.QUEUED
    assert topics(rt, other) == ["Queued"]
    later = rt.retry_many(by="bob", since=datetime.now(UTC) + timedelta(hours=1))
    assert (later.retried, later.refused) == ([], [])


def test_retry__a_recorded_write_replays_so_needs_no_force(rt: Runtime) -> None:
    """A run that completed a non-idempotent write and then failed is retried without force:
    the write is in its journal and replays (ADR 0070); from the write's step on, it would
    run again, so that needs force, and the forced event names it."""
    run_id = rt.enqueue(
        "scripted",
        {
            "steps": 3,
            "tool": {"effect": "non_idempotent_write", "at": 2},
            "fail": {"class": "auth", "at": 3},
        },
    )
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.FAILED
    assert rt.get(run_id).state.pending_effects == ()
    assert rt.retry_plan(run_id).rerun_writes == ()
    with pytest.raises(PendingWrite, match="send_email"):
        rt.retry(run_id, by="alice", from_position=2)
    rt.retry(run_id, by="alice", from_position=2, force=True)
    last = rt.history(run_id)[-1].event
    assert isinstance(last, Run.Retried)
    assert (last.forced, last.rerun_tools, last.mode) == (True, ("send_email",), RetryMode.FROM)
