"""The state a run's events fold into (`RunState`) and the parts it is made of.

Split out of `domain/run.py` (which keeps the events and the commands) when the waits of ADR
0073 grew it past the house limit; `steptrail.domain.run` re-exports every name here.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from steptrail.domain.enums import (
    Effect,
    FailureClass,
    RunStatus,
    Segment,
    TerminationReason,
    WaitKind,
)


class PendingEffect(BaseModel):
    """A write tool that was about to run at step `seq` and has not recorded its result yet.

    `claim_version` names the segment that recorded it: only that segment's result for the
    same step clears it. After a reclaim the next segment numbers its steps on from the last
    *recorded* one, so its step `seq` may coincide with a dead segment's unrecorded write.
    """

    model_config = ConfigDict(frozen=True)

    seq: int
    tool: str
    effect: Effect
    claim_version: int | None = None


class Waiting(BaseModel):
    """What a suspended run waits for, and the digest a decision must quote."""

    model_config = ConfigDict(frozen=True)

    kind: WaitKind
    digest: str
    since_version: int
    pending_tools: tuple[str, ...] = ()
    input_schema: dict[str, Any] | None = None
    # A timer or a signal wait (ADR 0073): the signal's name, and the step seq the wait
    # records its outcome at when the run is woken.
    name: str | None = None
    seq: int | None = None
    # The wait's deadline, as a duration from the suspending append (ADR 0068): the store
    # makes the run claimable at that append's instant plus this.
    timeout_ms: int | None = None


class Decision(BaseModel):
    """The latest human decision a resumed segment acts on."""

    model_config = ConfigDict(frozen=True)

    kind: WaitKind
    approved: bool
    by: str
    digest: str


_NEW = object.__new__
_SET = object.__setattr__  # what pydantic itself uses to fill a frozen model


class RunState(BaseModel):
    """Everything folding a run's events yields. Immutable; each event produces a new one."""

    model_config = ConfigDict(frozen=True)

    run_id: UUID
    agent: str
    version: int
    status: RunStatus
    segment: Segment | None = None
    holder: str | None = None
    lease_ms: int | None = None
    claim_version: int | None = None
    requeue_count: int = 0
    retry_delay_ms: int = 0
    reason: TerminationReason | None = None
    idempotency_key: str | None = None
    has_saved_request: bool = False
    request_digest: str | None = None
    steps: int = 0
    pending_effects: tuple[PendingEffect, ...] = ()
    failure_class: FailureClass | None = None
    error_type: str | None = None
    waiting: Waiting | None = None
    decision: Decision | None = None
    has_resumable_state: bool = False
    iterations: int = 0
    tokens: int = 0
    cost: float = 0.0
    trace_parent: str | None = None
    # While waiting with a deadline: how long after the suspending append the claim may take
    # the run (the run index's `available_at`, ADR 0068). None otherwise.
    wake_after_ms: int | None = None
    # The wait the run was last woken from (by its deadline, or by a signal): the woken
    # segment records that wait's outcome where the agent waits again (ADR 0073).
    woke: Waiting | None = None

    def evolve(self, **changes: Any) -> RunState:
        """This state with `changes` (field values of the right types, from the events'
        rules: nothing is validated, as with `model_copy(update=...)`). Built directly:
        `model_copy` copies the instance, then its dict, field set and private attributes
        one by one, and every step, claim and settle folds through here (ADR 0053)."""
        values = self.__dict__.copy()
        values.update(changes)
        new = _NEW(type(self))
        _SET(new, "__dict__", values)
        _SET(new, "__pydantic_fields_set__", self.__pydantic_fields_set__ | changes.keys())
        _SET(new, "__pydantic_extra__", None)
        _SET(new, "__pydantic_private__", None)
        return new

    @property
    def trace_id(self) -> str | None:
        """The trace every segment of the run joins (from `trace_parent`), or None."""
        return trace_id_of(self.trace_parent)

    @property
    def pending_non_idempotent_write(self) -> bool:
        return any(p.effect is Effect.NON_IDEMPOTENT_WRITE for p in self.pending_effects)


def _settled(state: RunState, status: RunStatus, **changes: Any) -> RunState:
    """A terminal state: no lease, no saved request, no resumable state; the version
    advanced in the same copy (`apply` then leaves it alone).

    The pending-effect markers survive on purpose: an auditor must still see that a write may
    have happened before the run ended.
    """
    return _released(
        state,
        status,
        has_saved_request=False,
        has_resumable_state=False,
        waiting=None,
        **changes,
    )


def _released(state: RunState, status: RunStatus, **changes: Any) -> RunState:
    """The current segment lets go of the run (back to the queue, or waiting for a person);
    the version advanced in the same copy."""
    changes.setdefault("wake_after_ms", None)
    return state.evolve(
        version=state.version + 1,
        status=status,
        segment=None,
        holder=None,
        lease_ms=None,
        claim_version=None,
        **changes,
    )


def trace_id_of(trace_parent: str | None) -> str | None:
    """The trace id (32 hex digits) of a W3C `traceparent` value, or None if it is not one."""
    if trace_parent is None:
        return None
    parts = trace_parent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    try:
        int(parts[1], 16)
    except ValueError:
        return None
    return parts[1]
