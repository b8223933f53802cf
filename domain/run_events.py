"""The events of a run's main lifecycle: queued or started, claimed, its steps recorded or
replayed, its lease renewed, an effect pending, settled (completed, failed, cancelled, dead
lettered) or put back (requeued, reclaimed).

Each is bound into `Run` as `Run.<Name>` (domain/run.py), the name the code, the docs and the
users know it by. A stored event is found again by its `TOPIC` (the registry `EVENT_TYPES`,
filled as each class is defined), never by where the class is defined: the topic strings
here are stored and never change (STYLE.md, habit 3).
"""

from __future__ import annotations

from typing import Any, ClassVar
from uuid import UUID

from pydantic import Field

from steptrail.domain.enums import (
    Effect,
    FailureClass,
    PrivacyLevel,
    RunStatus,
    Segment,
    TerminationReason,
)
from steptrail.domain.errors import IllegalTransition
from steptrail.domain.run_state import (
    DECISION_STEP,
    PendingEffect,
    RunEvent,
    RunState,
    released_state,
    settled_state,
)


class Queued(RunEvent):
    """A run was put on the queue; its request is saved beside the log, not in it."""

    TOPIC: ClassVar[str] = "steptrail.Run.Queued"
    run_id: UUID
    agent: str
    request_digest: str
    idempotency_key: str | None = None
    # The W3C traceparent of the enqueuer's context (ADR 0031): metadata, never content.
    trace_parent: str | None = None
    # Where the claim finds the run and in which order (ADR 0077); an event stored
    # before queues existed reads as the default queue at priority 0.
    queue: str = "default"
    priority: int = 0
    # A child run's parent, the parent's step that started it and the parent's privacy
    # level (ADR 0075); None for every other run and every event stored before.
    parent_id: UUID | None = None
    parent_seq: int | None = None
    privacy: PrivacyLevel | None = None
    # Its concurrency key and the limit resolved for it at enqueue (ADR 0078); an event
    # stored before keys existed reads as a run without a key.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None

    def apply(self, state: RunState | None) -> RunState:
        if state is not None:
            raise IllegalTransition("a run is queued only once")
        return RunState(
            run_id=self.run_id,
            agent=self.agent,
            version=1,
            status=RunStatus.QUEUED,
            has_saved_request=True,
            request_digest=self.request_digest,
            idempotency_key=self.idempotency_key,
            trace_parent=self.trace_parent,
            queue=self.queue,
            priority=self.priority,
            parent_id=self.parent_id,
            parent_seq=self.parent_seq,
            parent_privacy=self.privacy,
            concurrency_key=self.concurrency_key,
            concurrency_limit=self.concurrency_limit,
        )


class Started(RunEvent):
    """An interactive run began in its caller's process, holding an `interactive:` lease."""

    TOPIC: ClassVar[str] = "steptrail.Run.Started"
    run_id: UUID
    agent: str
    request_digest: str
    lease_ms: int
    trace_parent: str | None = None

    def apply(self, state: RunState | None) -> RunState:
        if state is not None:
            raise IllegalTransition("a run is started only once")
        return RunState(
            run_id=self.run_id,
            agent=self.agent,
            version=1,
            status=RunStatus.RUNNING,
            segment=Segment.INTERACTIVE,
            holder=self.actor,
            lease_ms=self.lease_ms,
            claim_version=1,
            request_digest=self.request_digest,
            trace_parent=self.trace_parent,
        )


class Claimed(RunEvent):
    """A worker took a queued run under a lease; this event's version is its fencing token."""

    TOPIC: ClassVar[str] = "steptrail.Run.Claimed"
    lease_ms: int

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        if s.status.is_waiting:
            # Taken because the wait's deadline passed (ADR 0068): the woken segment
            # records the wait's outcome (elapsed, expired, or what arrived meanwhile).
            return s.evolve(
                version=s.version + 1,
                status=RunStatus.RUNNING,
                segment=Segment.WORKER,
                holder=self.actor,
                lease_ms=self.lease_ms,
                claim_version=s.version + 1,
                waiting=None,
                wake_after_ms=None,
                woke=s.waiting,
            )
        return s.evolve(
            version=s.version + 1,
            status=RunStatus.RUNNING,
            segment=Segment.WORKER,
            holder=self.actor,
            lease_ms=self.lease_ms,
            claim_version=s.version + 1,
        )


class StepRecorded(RunEvent):
    """A step finished (or raised). Appending it is also the segment's heartbeat."""

    TOPIC: ClassVar[str] = "steptrail.Run.StepRecorded"
    seq: int
    kind: str
    name: str
    duration_ms: int
    payload: dict[str, Any] = Field(default_factory=dict)
    privacy: PrivacyLevel = PrivacyLevel.METADATA
    error_type: str | None = None
    tokens: int = 0
    cost: float = 0.0

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        # A write tool's marker is cleared only by its own successful result: a write that
        # raised may or may not have happened, so its marker must stay (ADR 0002).
        pending = s.pending_effects
        if pending and self.error_type is None:
            pending = tuple(
                p for p in pending if not (p.seq == self.seq and p.claim_version == s.claim_version)
            )
        return s.evolve(
            # The version too, in the same copy: this fold runs with every step, and
            # `apply` leaves a version already advanced alone (one model copy, not two).
            version=s.version + 1,
            steps=self.seq,
            pending_effects=pending,
            # A "decision" step is the agent taking the decision it resumed with (ADR
            # 0015): from then on the journal answers for it, and a later request for
            # approval waits for a new one.
            decision=None if self.kind == DECISION_STEP else s.decision,
            iterations=s.iterations + (1 if self.kind == "llm" else 0),
            tokens=s.tokens + self.tokens,
            cost=s.cost + self.cost,
        )


class Replayed(RunEvent):
    """A segment handed its agent the journaled outcomes of steps 1..`count` (the last of
    them recorded as step `last_seq`) instead of running them again (ADR 0013)."""

    TOPIC: ClassVar[str] = "steptrail.Run.Replayed"
    count: int
    last_seq: int

    def apply(self, state: RunState | None) -> RunState:
        return self._require(state)


class LeaseRenewed(RunEvent):
    """The holder extended its lease in the middle of a long step."""

    TOPIC: ClassVar[str] = "steptrail.Run.LeaseRenewed"

    def apply(self, state: RunState | None) -> RunState:
        return self._require(state)


class EffectPending(RunEvent):
    """A write tool is about to run at step `seq`; recorded before it runs, under the lease."""

    TOPIC: ClassVar[str] = "steptrail.Run.EffectPending"
    seq: int
    tool: str
    effect: Effect

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        marker = PendingEffect(
            seq=self.seq, tool=self.tool, effect=self.effect, claim_version=s.claim_version
        )
        return s.evolve(pending_effects=(*s.pending_effects, marker))


class Completed(RunEvent):
    """The agent returned; `result` is filtered by the privacy level like any step payload."""

    TOPIC: ClassVar[str] = "steptrail.Run.Completed"
    result: dict[str, Any] = Field(default_factory=dict)
    privacy: PrivacyLevel = PrivacyLevel.METADATA

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return settled_state(s, RunStatus.COMPLETED, reason=TerminationReason.COMPLETED)


class Failed(RunEvent):
    """The run ended in failure without a retry (interactive segment, or a policy reason)."""

    TOPIC: ClassVar[str] = "steptrail.Run.Failed"
    reason: TerminationReason
    failure_class: FailureClass | None = None
    error_type: str | None = None

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return settled_state(
            s,
            RunStatus.FAILED,
            reason=self.reason,
            failure_class=self.failure_class,
            error_type=self.error_type,
        )


class Cancelled(RunEvent):
    """Somebody cancelled the run; a worker running it learns so at its next append."""

    TOPIC: ClassVar[str] = "steptrail.Run.Cancelled"
    note: str | None = None

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return settled_state(s, RunStatus.CANCELLED, reason=TerminationReason.CANCELLED)


class Requeued(RunEvent):
    """A transient failure sent the run back to the queue, claimable after `delay_ms`."""

    TOPIC: ClassVar[str] = "steptrail.Run.Requeued"
    delay_ms: int
    failure_class: FailureClass
    error_type: str | None = None

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return released_state(
            s,
            RunStatus.QUEUED,
            requeue_count=s.requeue_count + 1,
            retry_delay_ms=self.delay_ms,
            failure_class=self.failure_class,
            error_type=self.error_type,
        )


class Reclaimed(RunEvent):
    """The reaper found the lease expired and put the run back on the queue at once."""

    TOPIC: ClassVar[str] = "steptrail.Run.Reclaimed"
    previous_holder: str | None = None

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return released_state(
            s, RunStatus.QUEUED, requeue_count=s.requeue_count + 1, retry_delay_ms=0
        )


class DeadLettered(RunEvent):
    """The run failed for good: `not_retryable` or `retries_exhausted`."""

    TOPIC: ClassVar[str] = "steptrail.Run.DeadLettered"
    reason: TerminationReason
    cause: str
    failure_class: FailureClass | None = None
    error_type: str | None = None

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return settled_state(
            s,
            RunStatus.FAILED,
            reason=self.reason,
            failure_class=self.failure_class or s.failure_class,
            error_type=self.error_type or s.error_type,
        )
