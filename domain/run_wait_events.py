"""The events of a run that waits or goes again: suspended for a person or a timer, decided,
resumed, released to the queue, and retried by an operator after it failed.

Each is bound into `Run` as `Run.<Name>` (domain/run.py); a stored event is found again by
its `TOPIC` (the registry `EVENT_TYPES`), never by where its class is defined.
"""

from __future__ import annotations

from typing import Any, ClassVar

from steptrail.domain.enums import (
    RetryMode,
    RunStatus,
    Segment,
    TerminationReason,
    WaitKind,
)
from steptrail.domain.run_state import (
    Decision,
    RunEvent,
    RunState,
    Waiting,
    released_state,
)


class Suspended(RunEvent):
    """The run stopped to wait for a person; its lease is released and its resumable state
    (pending calls and conversation) is saved verbatim beside the log."""

    TOPIC: ClassVar[str] = "steptrail.Run.Suspended"
    kind: WaitKind
    digest: str
    pending_tools: tuple[str, ...] = ()
    input_schema: dict[str, Any] | None = None
    # `timeout=`: the decision expires this long after the suspension (ADR 0073).
    timeout_ms: int | None = None

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        status = (
            RunStatus.WAITING_FOR_APPROVAL
            if self.kind is WaitKind.APPROVAL
            else RunStatus.WAITING_FOR_INPUT
        )
        waiting = Waiting(
            kind=self.kind,
            digest=self.digest,
            since_version=s.version + 1,
            pending_tools=self.pending_tools,
            input_schema=self.input_schema,
            timeout_ms=self.timeout_ms,
        )
        return released_state(
            s,
            status,
            waiting=waiting,
            decision=None,
            has_resumable_state=True,
            wake_after_ms=self.timeout_ms,
        )


class Decided(RunEvent):
    """A person approved or denied the pending calls (or submitted input), bound to their
    digest. The values of submitted input are never recorded, only their keys."""

    TOPIC: ClassVar[str] = "steptrail.Run.Decided"
    kind: WaitKind
    approved: bool
    digest: str
    input_keys: tuple[str, ...] = ()

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        decision = Decision(
            kind=self.kind, approved=self.approved, by=self.actor, digest=self.digest
        )
        return s.evolve(decision=decision)


class Resumed(RunEvent):
    """A resumer took the decided run under its own lease (`resume:` holder)."""

    TOPIC: ClassVar[str] = "steptrail.Run.Resumed"
    lease_ms: int

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return s.evolve(
            status=RunStatus.RUNNING,
            segment=Segment.RESUME,
            holder=self.actor,
            lease_ms=self.lease_ms,
            claim_version=s.version + 1,
            waiting=None,
            wake_after_ms=None,
        )


class Released(RunEvent):
    """A decided run was handed to the queue so that a worker resumes it."""

    TOPIC: ClassVar[str] = "steptrail.Run.Released"

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return s.evolve(status=RunStatus.QUEUED, waiting=None, retry_delay_ms=0, wake_after_ms=None)


class Retried(RunEvent):
    """An operator put a failed run back on the queue (ADR 0025).

    The run keeps its history and its step count; its pending-effect markers are cleared
    (the operator vouched for them: `forced` says a non-idempotent write was among them,
    `cleared_tools` names them) and, with `reset_budget`, its requeue budget starts over.
    """

    TOPIC: ClassVar[str] = "steptrail.Run.Retried"
    reset_budget: bool = False
    forced: bool = False
    previous_reason: TerminationReason | None = None
    cleared_tools: tuple[str, ...] = ()
    # Non-idempotent writes the run had completed, which running it again repeats.
    rerun_tools: tuple[str, ...] = ()
    # How the run runs again (ADR 0070): the steps before `position` replay from the
    # journal, those from it on run; `from` also dropped the journal's entries from
    # `position` on, in this append. The defaults describe every retry stored before
    # failed runs kept their journal: each restarted from the request.
    mode: RetryMode = RetryMode.RESTART
    position: int = 1

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return released_state(
            s,
            RunStatus.QUEUED,
            reason=None,
            has_saved_request=True,
            has_resumable_state=False,
            waiting=None,
            decision=None,
            pending_effects=(),
            retry_delay_ms=0,
            requeue_count=0 if self.reset_budget else s.requeue_count,
        )
