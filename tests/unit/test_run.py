"""Unit tests of the `Run` aggregate: every command's legal and illegal transitions, and replay.

Pure domain: no store, no clock. Each run below is built through the aggregate's own commands
and never committed, so its pending events are its whole history and can be replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID, uuid4

import pytest

from steptrail.domain.digest import digest
from steptrail.domain.enums import (
    Effect,
    FailureClass,
    PrivacyLevel,
    RunStatus,
    Segment,
    TerminationReason,
    WaitKind,
)
from steptrail.domain.errors import DigestMismatch, IllegalTransition
from steptrail.domain.run import EVENT_TYPES, PendingEffect, Run, RunEvent, RunState

RUN_ID = UUID("00000000-0000-4000-8000-000000000001")
AGENT = "echo"
REQUEST = digest({"prompt": "hello"})
API = "api:test"
WORKER = "worker:host-a:101:5f0c"
OTHER_WORKER = "worker:host-b:202:77aa"
INTERACTIVE = "interactive:host-a:101:0b1d"
RESUMER = "resume:host-a:303:9e2f"
REAPER = "reaper:host-c:404:1c3d"
OPERATOR = "operator:alice"
LEASE = 900_000
CALLS = digest([{"name": "send_email", "arguments": {"to": "x"}}])

Snapshot = tuple[RunState, int, int, tuple[RunEvent, ...]]


# -- builders: every run below is reached through commands only ---------------------------------


def queued() -> Run:
    return Run.enqueue(run_id=RUN_ID, agent=AGENT, request_digest=REQUEST, actor=API)


def running() -> Run:
    run = queued()
    run.claim(holder=WORKER, lease_ms=LEASE)
    return run


def interactive() -> Run:
    return Run.start(
        run_id=RUN_ID, agent=AGENT, request_digest=REQUEST, holder=INTERACTIVE, lease_ms=LEASE
    )


def waiting_for_approval() -> Run:
    run = running()
    run.suspend(kind=WaitKind.APPROVAL, digest=CALLS, pending_tools=("send_email",))
    return run


def waiting_for_input() -> Run:
    run = running()
    run.suspend(kind=WaitKind.INPUT, digest=CALLS, input_schema={"type": "object"})
    return run


def decided() -> Run:
    run = waiting_for_approval()
    run.decide(by=OPERATOR, kind=WaitKind.APPROVAL, approved=True, digest=CALLS)
    return run


def decided_interactive() -> Run:
    run = interactive()
    run.suspend(kind=WaitKind.APPROVAL, digest=CALLS, pending_tools=("send_email",))
    run.decide(by=OPERATOR, kind=WaitKind.APPROVAL, approved=False, digest=CALLS)
    return run


def resumed() -> Run:
    run = decided()
    run.resume(holder=RESUMER, lease_ms=LEASE)
    return run


def released() -> Run:
    run = decided()
    run.release(actor=API)
    return run


def completed() -> Run:
    run = running()
    run.complete(result={"answer": 42})
    return run


def failed() -> Run:
    run = running()
    run.fail(reason=TerminationReason.PROVIDER_FAILED, failure_class=FailureClass.AUTH)
    return run


def cancelled() -> Run:
    run = queued()
    run.cancel(actor=OPERATOR)
    return run


def dead_lettered() -> Run:
    run = running()
    run.dead_letter(actor=REAPER, reason=TerminationReason.NOT_RETRYABLE, cause="stale")
    return run


BUILDERS: dict[str, Callable[[], Run]] = {
    "queued": queued,
    "running": running,
    "interactive": interactive,
    "waiting_for_approval": waiting_for_approval,
    "waiting_for_input": waiting_for_input,
    "decided": decided,
    "decided_interactive": decided_interactive,
    "resumed": resumed,
    "released": released,
    "completed": completed,
    "failed": failed,
    "cancelled": cancelled,
    "dead_lettered": dead_lettered,
}
TERMINAL = ("completed", "failed", "cancelled", "dead_lettered")
HELD = ("running", "interactive", "resumed")


# -- commands with arguments that are valid wherever the command is legal ------------------------


def _approve(run: Run) -> None:
    run.decide(by=OPERATOR, kind=WaitKind.APPROVAL, approved=True, digest=CALLS)


COMMANDS: dict[str, Callable[[Run], Any]] = {
    "claim": lambda r: r.claim(holder=OTHER_WORKER, lease_ms=LEASE),
    "record_step": lambda r: r.record_step(kind="llm", name="chat", duration_ms=5),
    "renew_lease": lambda r: r.renew_lease(),
    "record_replay": lambda r: r.record_replay(count=2, last_seq=2),
    "mark_effect_pending": lambda r: r.mark_effect_pending(
        tool="send_email", effect=Effect.NON_IDEMPOTENT_WRITE
    ),
    "complete": lambda r: r.complete(),
    "fail": lambda r: r.fail(reason=TerminationReason.PROVIDER_FAILED),
    "cancel": lambda r: r.cancel(actor=OPERATOR),
    "requeue": lambda r: r.requeue(
        delay_ms=30_000, failure_class=FailureClass.SERVER_ERROR, error_type="HttpStatusError"
    ),
    "reclaim": lambda r: r.reclaim(actor=REAPER),
    "dead_letter": lambda r: r.dead_letter(
        actor=REAPER, reason=TerminationReason.RETRIES_EXHAUSTED, cause="requeue_budget_spent"
    ),
    "suspend": lambda r: r.suspend(kind=WaitKind.APPROVAL, digest=CALLS),
    "decide": _approve,
    "resume": lambda r: r.resume(holder=RESUMER, lease_ms=LEASE),
    "release": lambda r: r.release(actor=API),
    "retry": lambda r: r.retry(actor=OPERATOR),
}

# Which builder states each command is legal in, and the one event it then records.
LEGAL: dict[str, tuple[type[RunEvent], frozenset[str]]] = {
    "claim": (Run.Claimed, frozenset({"queued", "released"})),
    "record_step": (Run.StepRecorded, frozenset(HELD)),
    "renew_lease": (Run.LeaseRenewed, frozenset(HELD)),
    "record_replay": (Run.Replayed, frozenset(HELD)),
    "mark_effect_pending": (Run.EffectPending, frozenset(HELD)),
    "complete": (Run.Completed, frozenset(HELD)),
    "fail": (Run.Failed, frozenset(HELD)),
    "cancel": (Run.Cancelled, frozenset(BUILDERS) - set(TERMINAL)),
    # Only a worker segment with its saved request may requeue itself.
    "requeue": (Run.Requeued, frozenset({"running"})),
    # The resumed run was queued first, so it still has its saved request.
    "reclaim": (Run.Reclaimed, frozenset({"running", "resumed"})),
    "dead_letter": (Run.DeadLettered, frozenset(HELD)),
    "suspend": (Run.Suspended, frozenset(HELD)),
    # Waiting for input is the wrong kind; a decided run cannot be decided twice.
    "decide": (Run.Decided, frozenset({"waiting_for_approval"})),
    "resume": (Run.Resumed, frozenset({"decided", "decided_interactive"})),
    # An interactive run has no saved request to go back on the queue with.
    "release": (Run.Released, frozenset({"decided"})),
    # Only a failed run (dead-lettered or not) goes back on the queue by an operator's hand.
    "retry": (Run.Retried, frozenset({"failed", "dead_lettered"})),
}

CASES = [(state, command) for state in BUILDERS for command in COMMANDS]


def snapshot(run: Run) -> Snapshot:
    return (run.state, run.version, run.committed_version, run.pending_events)


def assert_refused(
    run: Run,
    command: Callable[[Run], Any],
    error: type[Exception] = IllegalTransition,
) -> None:
    """`command` raises `error` and leaves state, version and pending events as they were."""
    before = snapshot(run)
    with pytest.raises(error):
        command(run)
    assert snapshot(run) == before


def new_events(run: Run, before: int) -> list[type[RunEvent]]:
    return [type(e) for e in run.pending_events[before:]]


# -- the whole transition table --------------------------------------------------------------------


def test_legal_table__covers_every_command() -> None:
    """The transition table below names every command of `Run` and nothing else."""
    assert set(LEGAL) == set(COMMANDS)
    public = {
        name
        for name, value in vars(Run).items()
        if callable(value) and not name.startswith("_") and not isinstance(value, type)
    }
    # trigger/guard/holder are the seam the waits' commands (domain/waits.py) are built on.
    plumbing = {"mark_committed", "mark_committed_first", "checkpoint", "restore"}
    commands = public - plumbing - {"trigger", "guard", "holder"}
    assert commands == set(COMMANDS)


@pytest.mark.parametrize(("state", "command"), CASES)
def test_command__legal_records_one_event_illegal_changes_nothing(state: str, command: str) -> None:
    """In every state, a command either records exactly its one event or raises with no trace."""
    run = BUILDERS[state]()
    event_type, legal_in = LEGAL[command]
    if state in legal_in:
        before = len(run.pending_events)
        version = run.version
        COMMANDS[command](run)
        assert new_events(run, before) == [event_type]
        assert run.version == version + 1
        assert run.committed_version == 0
    else:
        assert_refused(run, COMMANDS[command])


@pytest.mark.parametrize(("state", "command"), CASES)
def test_command__replay_of_pending_events_equals_state(state: str, command: str) -> None:
    """Whatever a run went through, replaying its pending events yields its live state."""
    run = BUILDERS[state]()
    if state in LEGAL[command][1]:
        COMMANDS[command](run)
    replayed = Run.replay(run.pending_events)
    assert replayed.state == run.state
    assert replayed.version == len(run.pending_events)


@pytest.mark.parametrize("state", TERMINAL)
def test_terminal__nothing_is_appended(state: str) -> None:
    """A settled run refuses every command, so nothing is ever appended after it settled;
    the one exception is an operator's retry of a failed run (a new, explicit event)."""
    run = BUILDERS[state]()
    for name, command in COMMANDS.items():
        if name == "retry" and state in LEGAL["retry"][1]:
            continue
        assert_refused(run, command)


# -- construction ----------------------------------------------------------------------------------


def test_enqueue__queued_with_saved_request() -> None:
    """Enqueue records one Queued event and yields a claimable run at version 1."""
    run = Run.enqueue(
        run_id=RUN_ID, agent=AGENT, request_digest=REQUEST, actor=API, idempotency_key="k-1"
    )
    [event] = run.pending_events
    assert isinstance(event, Run.Queued)
    assert event.actor == API
    assert run.id == RUN_ID
    assert run.version == 1
    assert run.committed_version == 0
    s = run.state
    assert s.status is RunStatus.QUEUED
    assert s.agent == AGENT
    assert s.request_digest == REQUEST
    assert s.idempotency_key == "k-1"
    assert s.has_saved_request is True
    assert s.holder is None
    assert s.segment is None
    assert s.requeue_count == 0
    assert s.steps == 0


def test_start__interactive_running_under_lease() -> None:
    """Start records one Started event: running at once, held by the interactive segment."""
    run = interactive()
    [event] = run.pending_events
    assert isinstance(event, Run.Started)
    s = run.state
    assert s.status is RunStatus.RUNNING
    assert s.segment is Segment.INTERACTIVE
    assert s.holder == INTERACTIVE
    assert s.lease_ms == LEASE
    assert s.claim_version == 1
    assert s.version == 1
    assert s.has_saved_request is False


@pytest.mark.parametrize("lease_ms", [0, -1])
def test_start__non_positive_lease_refused(lease_ms: int) -> None:
    """An interactive start without a positive lease raises before any run exists."""
    with pytest.raises(IllegalTransition):
        Run.start(
            run_id=RUN_ID,
            agent=AGENT,
            request_digest=REQUEST,
            holder=INTERACTIVE,
            lease_ms=lease_ms,
        )


def test_replay__needs_a_creation_event() -> None:
    """Replay of no events, or of a history not opening with a creation event, raises."""
    with pytest.raises(IllegalTransition):
        Run.replay([])
    with pytest.raises(IllegalTransition):
        Run.replay(running().pending_events[1:])


def test_replay__second_creation_event_refused() -> None:
    """A history with two creation events cannot be folded."""
    events = queued().pending_events
    with pytest.raises(IllegalTransition):
        Run.replay([*events, *events])


def test_replay__committed_and_nothing_pending() -> None:
    """A replayed run has no pending events and is committed at its last version."""
    run = Run.replay(resumed().pending_events)
    assert run.pending_events == ()
    assert run.committed_version == run.version == 5


def test_event_types__every_nested_event_registered_by_topic() -> None:
    """Every event nested on `Run` is registered under its own, unique, stable topic."""
    nested = [v for v in vars(Run).values() if isinstance(v, type) and issubclass(v, RunEvent)]
    assert len(nested) == 18
    for cls in nested:
        assert cls.TOPIC.startswith("steptrail.Run.")
        assert EVENT_TYPES[cls.TOPIC] is cls


def test_mark_committed__clears_pending_and_fences_on_version() -> None:
    """After a commit the next append is fenced on the committed version."""
    run = running()
    run.mark_committed()
    assert run.pending_events == ()
    assert run.committed_version == 2
    run.record_step(kind="llm", name="chat", duration_ms=1)
    assert run.committed_version == 2
    assert run.version == 3
    assert [type(e) for e in run.pending_events] == [Run.StepRecorded]


def test_restore__forgets_only_what_came_after_the_checkpoint() -> None:
    """A refused append drops the events triggered since its checkpoint; events deferred
    before it (a finished step's record) stay pending."""
    run = running()
    run.mark_committed()
    run.record_step(kind="llm", name="deferred", duration_ms=1)
    checkpoint = run.checkpoint()
    run.complete()
    run.restore(checkpoint)
    assert run.state == checkpoint[0]
    assert [type(e) for e in run.pending_events] == [Run.StepRecorded]
    assert run.status is RunStatus.RUNNING


# -- claim -----------------------------------------------------------------------------------------


def test_claim__queued_becomes_running_worker_segment() -> None:
    """Claim puts a queued run under the worker's lease; its version is the fencing token."""
    run = queued()
    run.claim(holder=WORKER, lease_ms=LEASE)
    s = run.state
    assert s.status is RunStatus.RUNNING
    assert s.segment is Segment.WORKER
    assert s.holder == WORKER
    assert s.lease_ms == LEASE
    assert s.claim_version == 2 == s.version
    assert run.pending_events[-1] == Run.Claimed(actor=WORKER, lease_ms=LEASE)


@pytest.mark.parametrize("lease_ms", [0, -5])
def test_claim__non_positive_lease_refused(lease_ms: int) -> None:
    """A claim without a positive lease raises and records nothing."""
    assert_refused(queued(), lambda r: r.claim(holder=WORKER, lease_ms=lease_ms))


def test_claim__running_run_cannot_be_claimed_twice() -> None:
    """A second worker cannot claim a run somebody already holds."""
    run = running()
    assert_refused(run, lambda r: r.claim(holder=OTHER_WORKER, lease_ms=LEASE))
    assert run.state.holder == WORKER


# -- record_step -----------------------------------------------------------------------------------


def test_record_step__numbers_steps_and_sums_usage() -> None:
    """Steps are numbered 1, 2, …; llm steps count as iterations; tokens and cost add up."""
    run = running()
    first = run.record_step(kind="llm", name="chat", duration_ms=10, tokens=7, cost=0.25)
    second = run.record_step(kind="tool", name="search", duration_ms=3, tokens=1, cost=0.5)
    assert (first, second) == (1, 2)
    s = run.state
    assert s.steps == 2
    assert s.iterations == 1
    assert s.tokens == 8
    assert s.cost == pytest.approx(0.75)
    assert s.status is RunStatus.RUNNING
    assert s.holder == WORKER


def test_record_step__event_carries_holder_and_payload() -> None:
    """The StepRecorded event is appended by the holder with the payload as given."""
    run = running()
    run.record_step(
        kind="tool",
        name="search",
        duration_ms=-4,
        payload={"tool": "search", "content_length": 3},
        privacy=PrivacyLevel.REDACTED,
        error_type="TimeoutError",
    )
    event = run.pending_events[-1]
    assert event == Run.StepRecorded(
        actor=WORKER,
        seq=1,
        kind="tool",
        name="search",
        duration_ms=0,
        payload={"tool": "search", "content_length": 3},
        privacy=PrivacyLevel.REDACTED,
        error_type="TimeoutError",
    )


@pytest.mark.parametrize("state", ["queued", "waiting_for_approval", "released", *TERMINAL])
def test_record_step__refused_without_a_lease(state: str) -> None:
    """Only a running run's holder records steps; anywhere else the heartbeat fails."""
    assert_refused(BUILDERS[state](), lambda r: r.record_step(kind="llm", name="x", duration_ms=1))


def test_renew_lease__records_heartbeat_only() -> None:
    """A lease renewal advances the version and changes nothing else."""
    run = running()
    before = run.state
    run.renew_lease()
    assert run.pending_events[-1] == Run.LeaseRenewed(actor=WORKER)
    assert run.state == before.evolve(version=before.version + 1)


# -- pending effects -------------------------------------------------------------------------------


def test_mark_effect_pending__marker_for_next_step() -> None:
    """The marker names the next step's sequence number, the tool and its effect."""
    run = running()
    run.record_step(kind="llm", name="chat", duration_ms=1)
    seq = run.mark_effect_pending(tool="send_email", effect=Effect.NON_IDEMPOTENT_WRITE)
    assert seq == 2
    assert run.state.pending_effects == (
        PendingEffect(
            seq=2,
            tool="send_email",
            effect=Effect.NON_IDEMPOTENT_WRITE,
            claim_version=run.state.claim_version,
        ),
    )
    assert run.state.pending_non_idempotent_write is True
    assert run.state.steps == 1


def test_mark_effect_pending__idempotent_write_is_not_non_idempotent() -> None:
    """An idempotent write leaves a marker that does not count as a non-idempotent write."""
    run = running()
    run.mark_effect_pending(tool="upsert", effect=Effect.IDEMPOTENT_WRITE)
    assert len(run.state.pending_effects) == 1
    assert run.state.pending_non_idempotent_write is False


def test_mark_effect_pending__read_only_refused() -> None:
    """A read-only tool needs no marker, so asking for one raises and records nothing."""
    assert_refused(
        running(), lambda r: r.mark_effect_pending(tool="search", effect=Effect.READ_ONLY)
    )


def test_step_recorded__success_of_same_seq_clears_marker() -> None:
    """The write tool's own successful result clears its pending-effect marker."""
    run = running()
    seq = run.mark_effect_pending(tool="send_email", effect=Effect.NON_IDEMPOTENT_WRITE)
    assert run.record_step(kind="tool", name="send_email", duration_ms=2) == seq
    assert run.state.pending_effects == ()


def test_step_recorded__errored_step_keeps_marker() -> None:
    """A write that raised may have happened, so its errored step keeps the marker."""
    run = running()
    seq = run.mark_effect_pending(tool="send_email", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="send_email", duration_ms=2, error_type="TimeoutError")
    assert [p.seq for p in run.state.pending_effects] == [seq]
    assert run.state.pending_non_idempotent_write is True


def test_step_recorded__success_of_other_seq_keeps_marker() -> None:
    """A later successful step does not clear an earlier step's marker."""
    run = running()
    seq = run.mark_effect_pending(tool="send_email", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="send_email", duration_ms=2, error_type="OSError")
    run.record_step(kind="llm", name="chat", duration_ms=2)
    assert [p.seq for p in run.state.pending_effects] == [seq]


@pytest.mark.parametrize(
    "settle",
    [
        lambda r: r.complete(),
        lambda r: r.fail(reason=TerminationReason.PROVIDER_FAILED),
        lambda r: r.cancel(actor=OPERATOR),
        lambda r: r.dead_letter(
            actor=REAPER, reason=TerminationReason.NOT_RETRYABLE, cause="write_pending"
        ),
    ],
    ids=["complete", "fail", "cancel", "dead_letter"],
)
def test_settle__clears_request_state_holder_keeps_pending_effects(
    settle: Callable[[Run], None],
) -> None:
    """Settling drops the saved request, resumable state and lease, but keeps effect markers."""
    run = resumed()
    run.mark_effect_pending(tool="send_email", effect=Effect.NON_IDEMPOTENT_WRITE)
    assert run.state.has_saved_request is True
    assert run.state.has_resumable_state is True
    markers = run.state.pending_effects
    settle(run)
    s = run.state
    assert s.status.is_terminal
    assert s.has_saved_request is False
    assert s.has_resumable_state is False
    assert s.holder is None
    assert s.segment is None
    assert s.lease_ms is None
    assert s.claim_version is None
    assert s.waiting is None
    assert s.pending_effects == markers != ()


# -- settle ----------------------------------------------------------------------------------------


def test_complete__completed_with_reason() -> None:
    """Complete ends the run completed/completed and keeps the result in its event."""
    run = running()
    run.complete(result={"answer": 42}, privacy=PrivacyLevel.FULL)
    assert run.state.status is RunStatus.COMPLETED
    assert run.state.reason is TerminationReason.COMPLETED
    assert run.pending_events[-1] == Run.Completed(
        actor=WORKER, result={"answer": 42}, privacy=PrivacyLevel.FULL
    )


def test_fail__failed_with_reason_and_class() -> None:
    """Fail ends the run failed with the given reason, failure class and error type."""
    run = interactive()
    run.fail(
        reason=TerminationReason.PROVIDER_FAILED,
        failure_class=FailureClass.AUTH,
        error_type="HttpStatusError",
    )
    s = run.state
    assert s.status is RunStatus.FAILED
    assert s.reason is TerminationReason.PROVIDER_FAILED
    assert s.failure_class is FailureClass.AUTH
    assert s.error_type == "HttpStatusError"


def test_settle__first_outcome_wins() -> None:
    """A late or duplicate settle raises and changes nothing about the first outcome."""
    run = completed()
    for command in ("complete", "fail", "cancel", "dead_letter"):
        assert_refused(run, COMMANDS[command])
    assert run.state.status is RunStatus.COMPLETED
    assert run.state.reason is TerminationReason.COMPLETED


# -- cancel ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    ["queued", "running", "interactive", "waiting_for_input", "decided", "resumed", "released"],
)
def test_cancel__any_live_run_is_cancelled(state: str) -> None:
    """Cancel works on queued, running and waiting runs, and drops the resumable state."""
    run = BUILDERS[state]()
    run.cancel(actor=OPERATOR, note="no longer needed")
    assert run.pending_events[-1] == Run.Cancelled(actor=OPERATOR, note="no longer needed")
    s = run.state
    assert s.status is RunStatus.CANCELLED
    assert s.reason is TerminationReason.CANCELLED
    assert s.has_resumable_state is False
    assert s.holder is None


def test_cancel__cancelled_queued_run_cannot_be_claimed() -> None:
    """A cancelled queued run can no longer be claimed."""
    run = cancelled()
    assert_refused(run, lambda r: r.claim(holder=WORKER, lease_ms=LEASE))


# -- requeue ---------------------------------------------------------------------------------------


def test_requeue__back_on_queue_counting_one() -> None:
    """Requeue releases the lease, counts one requeue and remembers delay and failure."""
    run = running()
    run.requeue(delay_ms=30_000, failure_class=FailureClass.RATE_LIMIT, error_type="Http429")
    assert run.pending_events[-1] == Run.Requeued(
        actor=WORKER, delay_ms=30_000, failure_class=FailureClass.RATE_LIMIT, error_type="Http429"
    )
    s = run.state
    assert s.status is RunStatus.QUEUED
    assert s.holder is None
    assert s.segment is None
    assert s.lease_ms is None
    assert s.claim_version is None
    assert s.requeue_count == 1
    assert s.retry_delay_ms == 30_000
    assert s.failure_class is FailureClass.RATE_LIMIT
    assert s.error_type == "Http429"
    assert s.has_saved_request is True


def test_requeue__counts_accumulate_across_claims() -> None:
    """Each requeue after a fresh claim adds one to the shared budget counter."""
    run = running()
    for expected in (1, 2, 3):
        run.requeue(delay_ms=0, failure_class=FailureClass.CONNECTION, error_type=None)
        assert run.state.requeue_count == expected
        run.claim(holder=WORKER, lease_ms=LEASE)


def test_requeue__negative_delay_refused() -> None:
    """A negative requeue delay raises and records nothing."""
    assert_refused(
        running(),
        lambda r: r.requeue(delay_ms=-1, failure_class=FailureClass.CONNECTION, error_type=None),
    )


@pytest.mark.parametrize("state", ["interactive", "resumed"])
def test_requeue__non_worker_segment_refused(state: str) -> None:
    """Interactive and resumed segments cannot requeue themselves."""
    assert_refused(BUILDERS[state](), COMMANDS["requeue"])


# -- reclaim ---------------------------------------------------------------------------------------


def test_reclaim__stale_run_back_on_queue_at_once() -> None:
    """Reclaim names the previous holder, releases the lease, counts a requeue, no delay."""
    run = running()
    run.requeue(delay_ms=60_000, failure_class=FailureClass.CONNECTION, error_type=None)
    run.claim(holder=WORKER, lease_ms=LEASE)
    run.reclaim(actor=REAPER)
    assert run.pending_events[-1] == Run.Reclaimed(actor=REAPER, previous_holder=WORKER)
    s = run.state
    assert s.status is RunStatus.QUEUED
    assert s.holder is None
    assert s.requeue_count == 2
    assert s.retry_delay_ms == 0


def test_reclaim__without_saved_request_refused() -> None:
    """An interactive run has no saved request, so the reaper cannot put it on the queue."""
    assert_refused(interactive(), COMMANDS["reclaim"])


def test_reclaim__fences_out_previous_holder() -> None:
    """After a reclaim and a new claim, the old holder is no longer the holder."""
    run = running()
    run.reclaim(actor=REAPER)
    run.claim(holder=OTHER_WORKER, lease_ms=LEASE)
    assert run.state.holder == OTHER_WORKER
    assert run.state.claim_version == run.version == 4


# -- dead_letter -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason", [TerminationReason.NOT_RETRYABLE, TerminationReason.RETRIES_EXHAUSTED]
)
def test_dead_letter__failed_with_dead_letter_reason(reason: TerminationReason) -> None:
    """Dead-letter ends a running run failed with a dead-letter reason, not a new status."""
    run = running()
    run.dead_letter(
        actor=REAPER,
        reason=reason,
        cause="c",
        failure_class=FailureClass.CONNECTION,
        error_type="ConnectionError",
    )
    s = run.state
    assert s.status is RunStatus.FAILED
    assert s.reason is reason
    assert s.reason.is_dead_letter
    assert s.failure_class is FailureClass.CONNECTION
    assert s.error_type == "ConnectionError"


def test_dead_letter__keeps_last_failure_when_none_given() -> None:
    """Without a class of its own, the dead-letter keeps the failure that requeued the run."""
    run = running()
    run.requeue(delay_ms=0, failure_class=FailureClass.SERVER_ERROR, error_type="Http503")
    run.claim(holder=WORKER, lease_ms=LEASE)
    run.dead_letter(actor=REAPER, reason=TerminationReason.RETRIES_EXHAUSTED, cause="budget")
    assert run.state.failure_class is FailureClass.SERVER_ERROR
    assert run.state.error_type == "Http503"


@pytest.mark.parametrize(
    "reason",
    [r for r in TerminationReason if not r.is_dead_letter],
)
def test_dead_letter__other_reason_refused(reason: TerminationReason) -> None:
    """Only not_retryable and retries_exhausted are dead-letter reasons."""
    assert_refused(running(), lambda r: r.dead_letter(actor=REAPER, reason=reason, cause="c"))


# -- suspend / decide / resume / release -----------------------------------------------------------


def test_suspend__approval_releases_lease_and_saves_state() -> None:
    """Suspending for approval waits with no lease, resumable state saved, digest bound."""
    run = running()
    run.record_step(kind="llm", name="chat", duration_ms=1)
    run.suspend(kind=WaitKind.APPROVAL, digest=CALLS, pending_tools=("send_email",))
    s = run.state
    assert s.status is RunStatus.WAITING_FOR_APPROVAL
    assert s.holder is None
    assert s.segment is None
    assert s.lease_ms is None
    assert s.has_resumable_state is True
    assert s.has_saved_request is True
    assert s.decision is None
    assert s.waiting is not None
    assert s.waiting.kind is WaitKind.APPROVAL
    assert s.waiting.digest == CALLS
    assert s.waiting.pending_tools == ("send_email",)
    assert s.waiting.since_version == s.version == 4


def test_suspend__input_waits_for_input_with_schema() -> None:
    """Suspending for input waits for input and keeps the declared schema."""
    s = waiting_for_input().state
    assert s.status is RunStatus.WAITING_FOR_INPUT
    assert s.waiting is not None
    assert s.waiting.input_schema == {"type": "object"}


def test_decide__records_decision_bound_to_digest() -> None:
    """A decision quoting the waited-on digest is recorded with who decided."""
    run = waiting_for_approval()
    run.decide(by=OPERATOR, kind=WaitKind.APPROVAL, approved=False, digest=CALLS)
    assert run.pending_events[-1] == Run.Decided(
        actor=OPERATOR, kind=WaitKind.APPROVAL, approved=False, digest=CALLS
    )
    s = run.state
    assert s.status is RunStatus.WAITING_FOR_APPROVAL
    assert s.decision is not None
    assert (s.decision.approved, s.decision.by, s.decision.digest) == (False, OPERATOR, CALLS)


def test_decide__input_records_keys_only() -> None:
    """A decision on input records the submitted keys, which the event carries."""
    run = waiting_for_input()
    run.decide(by=OPERATOR, kind=WaitKind.INPUT, approved=True, digest=CALLS, input_keys=("city",))
    event = run.pending_events[-1]
    assert isinstance(event, Run.Decided)
    assert event.input_keys == ("city",)


def test_decide__wrong_digest_raises_digest_mismatch() -> None:
    """A decision naming other pending calls raises DigestMismatch and records nothing."""
    other = digest([{"name": "delete_everything"}])
    assert_refused(
        waiting_for_approval(),
        lambda r: r.decide(by=OPERATOR, kind=WaitKind.APPROVAL, approved=True, digest=other),
        DigestMismatch,
    )


def test_decide__wrong_kind_refused() -> None:
    """An approval for a run waiting for input raises and records nothing."""
    assert_refused(waiting_for_input(), _approve)


def test_decide__second_decision_refused() -> None:
    """A decided run cannot be decided again (the losing resumer's "already resuming")."""
    assert_refused(decided(), _approve)


def test_resume__decided_run_runs_under_resume_lease() -> None:
    """Resume runs a decided run under the resumer's lease and stops waiting."""
    run = decided()
    run.resume(holder=RESUMER, lease_ms=LEASE)
    s = run.state
    assert s.status is RunStatus.RUNNING
    assert s.segment is Segment.RESUME
    assert s.holder == RESUMER
    assert s.lease_ms == LEASE
    assert s.claim_version == s.version
    assert s.waiting is None
    assert s.decision is not None
    assert s.decision.approved is True


def test_resume__undecided_run_refused() -> None:
    """A run nobody has decided yet cannot be resumed nor released."""
    assert_refused(waiting_for_approval(), COMMANDS["resume"])
    assert_refused(waiting_for_approval(), COMMANDS["release"])


@pytest.mark.parametrize("lease_ms", [0, -1])
def test_resume__non_positive_lease_refused(lease_ms: int) -> None:
    """A resume without a positive lease raises and records nothing."""
    assert_refused(decided(), lambda r: r.resume(holder=RESUMER, lease_ms=lease_ms))


def test_resume__second_resume_loses() -> None:
    """Once one resumer holds the run, a second resume raises and the first keeps it."""
    run = resumed()
    assert_refused(run, lambda r: r.resume(holder="resume:other:1:x", lease_ms=LEASE))
    assert run.state.holder == RESUMER


def test_release__decided_run_back_on_queue() -> None:
    """Release hands a decided run to the queue with no delay, decision kept for the worker."""
    run = released()
    assert run.pending_events[-1] == Run.Released(actor=API)
    s = run.state
    assert s.status is RunStatus.QUEUED
    assert s.waiting is None
    assert s.holder is None
    assert s.retry_delay_ms == 0
    assert s.decision is not None
    assert s.has_resumable_state is True


def test_release__interactive_run_refused() -> None:
    """A run without a saved request cannot go back on the queue."""
    assert_refused(decided_interactive(), COMMANDS["release"])


def test_suspend_again__counters_carry_over() -> None:
    """A resumed run may suspend again; steps and usage carry over, the old decision is gone."""
    run = resumed()
    run.record_step(kind="llm", name="chat", duration_ms=1, tokens=5)
    run.suspend(kind=WaitKind.INPUT, digest=digest(["again"]))
    s = run.state
    assert s.status is RunStatus.WAITING_FOR_INPUT
    assert s.steps == 1
    assert s.tokens == 5
    assert s.iterations == 1
    assert s.decision is None
    assert s.waiting is not None
    assert s.waiting.kind is WaitKind.INPUT


def test_marker__cleared_only_by_the_segment_that_recorded_it() -> None:
    """After a reclaim, the next segment's step with the same number does not clear a dead
    segment's unrecorded write marker."""
    run = Run.enqueue(run_id=uuid4(), agent="a", request_digest="d", actor="t")
    run.claim(holder="w1", lease_ms=1000)
    seq = run.mark_effect_pending(tool="upsert", effect=Effect.IDEMPOTENT_WRITE)
    run.reclaim(actor="reaper")
    run.claim(holder="w2", lease_ms=1000)
    assert run.record_step(kind="llm", name="think", duration_ms=1) == seq
    assert [(p.tool, p.seq) for p in run.state.pending_effects] == [("upsert", seq)]
