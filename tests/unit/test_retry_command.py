"""Unit tests of `Run.retry`: which runs may go back on the queue, and what `Retried` folds to."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

import pytest
from rich.console import Console

from steptrail.domain.digest import digest
from steptrail.domain.enums import Effect, FailureClass, RetryMode, RunStatus, TerminationReason
from steptrail.domain.errors import IllegalTransition, PendingWrite
from steptrail.domain.ports import RecordedEvent
from steptrail.domain.retry_plan import writes_done
from steptrail.domain.run import Run, fold
from steptrail.infrastructure.codec import decode_event
from steptrail.render import trail_table

RUN_ID = UUID("00000000-0000-4000-8000-000000000013")
WORKER = "worker:host-a:1:aa"


def failed(*, write: Effect | None = None, requeues: int = 0) -> Run:
    """A queued run that failed for good after `requeues` transient failures."""
    run = Run.enqueue(run_id=RUN_ID, agent="a", request_digest=digest({}), actor="api")
    for _ in range(requeues):
        run.claim(holder=WORKER, lease_ms=1000)
        run.requeue(delay_ms=0, failure_class=FailureClass.SERVER_ERROR, error_type="E")
    run.claim(holder=WORKER, lease_ms=1000)
    if write is not None:
        run.mark_effect_pending(tool="pay", effect=write)
    run.dead_letter(actor=WORKER, reason=TerminationReason.RETRIES_EXHAUSTED, cause="budget")
    return run


def test_retry__failed_run_goes_back_on_the_queue() -> None:
    """A dead-lettered run becomes queued with its request, reason cleared, budget kept."""
    run = failed(requeues=2)
    run.retry(actor="alice")
    event = run.pending_events[-1]
    assert isinstance(event, Run.Retried)
    assert (event.actor, event.forced, event.reset_budget) == ("alice", False, False)
    assert event.previous_reason is TerminationReason.RETRIES_EXHAUSTED
    s = run.state
    assert (s.status, s.reason, s.has_saved_request, s.requeue_count) == (
        RunStatus.QUEUED,
        None,
        True,
        2,
    )
    assert fold(run.pending_events) == s


def test_retry__reset_budget_starts_the_requeue_count_over() -> None:
    """With reset_budget the requeue count is zero again."""
    run = failed(requeues=3)
    run.retry(actor="alice", reset_budget=True)
    assert run.state.requeue_count == 0


@pytest.mark.parametrize("make", [lambda r: None, lambda r: r.cancel(actor="op")])
def test_retry__refused_unless_failed(make: object) -> None:
    """A queued or cancelled run cannot be retried; nothing is recorded."""
    run = Run.enqueue(run_id=RUN_ID, agent="a", request_digest=digest({}), actor="api")
    make(run)  # type: ignore[operator]
    before = len(run.pending_events)
    with pytest.raises(IllegalTransition, match="only a failed run"):
        run.retry(actor="alice")
    assert len(run.pending_events) == before


def test_retry__pending_non_idempotent_write_needs_force() -> None:
    """A write that may have happened refuses a plain retry; force records it and clears it."""
    run = failed(write=Effect.NON_IDEMPOTENT_WRITE)
    with pytest.raises(PendingWrite, match="pay"):
        run.retry(actor="alice")
    run.retry(actor="alice", force=True)
    event = run.pending_events[-1]
    assert isinstance(event, Run.Retried)
    assert (event.forced, event.cleared_tools) == (True, ("pay",))
    assert run.state.pending_effects == ()


def test_retry__idempotent_write_needs_no_force() -> None:
    """An idempotent write may safely run again: no force needed, and nothing is 'forced'."""
    run = failed(write=Effect.IDEMPOTENT_WRITE)
    run.retry(actor="alice")
    event = run.pending_events[-1]
    assert isinstance(event, Run.Retried)
    assert event.forced is False
    assert event.cleared_tools == ("pay",)


def test_retry__needs_an_actor() -> None:
    """A blank name is refused."""
    with pytest.raises(IllegalTransition, match="--by"):
        failed().retry(actor=" ")


def test_retry__completed_non_idempotent_writes_need_force() -> None:
    """Writes the run already did that the retry runs again (its journal gone: a restart)
    are refused unless forced, and the event names them and the mode."""
    run = Run.enqueue(run_id=RUN_ID, agent="a", request_digest=digest({}), actor="api")
    run.claim(holder=WORKER, lease_ms=1000)
    seq = run.mark_effect_pending(tool="charge", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="charge", duration_ms=1)
    assert seq == 1
    run.dead_letter(actor=WORKER, reason=TerminationReason.NOT_RETRYABLE, cause="later step")
    done = writes_done(run.pending_events)
    assert done == ("charge",)
    with pytest.raises(PendingWrite, match=r"charge.*journal is gone"):
        run.retry(actor="alice", mode=RetryMode.RESTART, rerun_writes=done)
    with pytest.raises(PendingWrite, match=r"from step 1 .*\(charge\)"):
        run.retry(actor="alice", mode=RetryMode.FROM, rerun_writes=done)
    run.retry(actor="alice", mode=RetryMode.RESTART, rerun_writes=done, force=True)
    event = run.pending_events[-1]
    assert isinstance(event, Run.Retried)
    assert (event.forced, event.rerun_tools, event.cleared_tools) == (True, ("charge",), ())
    assert (event.mode, event.position) == (RetryMode.RESTART, 1)


def test_writes_done__only_completed_non_idempotent_writes() -> None:
    """An idempotent write, a write that raised, and a marker without a result are not
    'done'; a non-idempotent write with its result is."""
    run = Run.enqueue(run_id=RUN_ID, agent="a", request_digest=digest({}), actor="api")
    run.claim(holder=WORKER, lease_ms=1000)
    run.mark_effect_pending(tool="put", effect=Effect.IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="put", duration_ms=1)
    run.mark_effect_pending(tool="mail", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="mail", duration_ms=1, error_type="Timeout")
    run.mark_effect_pending(tool="pay", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="pay", duration_ms=1)
    run.mark_effect_pending(tool="ship", effect=Effect.NON_IDEMPOTENT_WRITE)
    assert writes_done(run.pending_events) == ("pay",)


def test_retried__the_trail_shows_mode_and_position() -> None:
    """`steptrail show` prints each retry's mode and the step it runs again from."""
    run = failed()
    run.retry(actor="alice", mode=RetryMode.FROM, position=2)
    recorded = RecordedEvent(RUN_ID, run.version, datetime.now(UTC), run.pending_events[-1])
    console = Console(width=200, record=True)
    console.print(trail_table([recorded]))
    assert "mode=from position=2" in console.export_text()


def test_retried__an_event_stored_before_modes_decodes_as_a_restart() -> None:
    """A `Retried` stored before it had a mode (every retry then ran from the request)
    reads back as a restart from step 1, with no upcaster needed."""
    old = b'{"actor":"alice","reset_budget":false,"forced":true,"previous_reason":null,'
    old += b'"cleared_tools":[],"rerun_tools":["send_email"]}'
    event = decode_event(Run.Retried.TOPIC, old)
    assert isinstance(event, Run.Retried)
    assert (event.mode, event.position, event.rerun_tools) == (
        RetryMode.RESTART,
        1,
        ("send_email",),
    )
