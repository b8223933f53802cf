"""What folding a run's events yields, and the base every run event derives from.

`RunState` is the immutable state of one run; `RunEvent` is the base of the events nested on
`Run` (in `domain/run.py`, with the commands that trigger them), each a small pure fold from
one state to the next. Split from `domain/run.py` by concern (the state and the fold rule
here, the aggregate's events and commands there); `domain/run.py` re-exports every name, so
imports and stored topics are unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from steptrail.domain.enums import (
    Effect,
    FailureClass,
    PrivacyLevel,
    RunStatus,
    Segment,
    TerminationReason,
    WaitKind,
)
from steptrail.domain.errors import IllegalTransition

# The step kind that records an agent taking the human decision it resumed with.
DECISION_STEP = "decision"

# Every event class, by its stored topic. Topics are stable names written into the log, so a
# module or class rename never orphans stored events; they are never renamed (STYLE 3).
EVENT_TYPES: dict[str, type[RunEvent]] = {}


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
    # A wait for any of several signals (`wait_any` on child runs, ADR 0075): every name
    # that ends it; `name` is the first of them.
    names: tuple[str, ...] = ()


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
    # The queue the run was enqueued to and its claim priority (ADR 0077): columns of the
    # run index, which the claim walks by them.
    queue: str = "default"
    priority: int = 0
    # A child run (ADR 0075): its parent, the parent's step that started it, and the
    # parent's privacy level, which the child keeps if it is stricter than its agent's.
    parent_id: UUID | None = None
    parent_seq: int | None = None
    parent_privacy: PrivacyLevel | None = None
    # Its concurrency key and limit (ADR 0078): columns of the run index too.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None

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


def settled_state(state: RunState, status: RunStatus, **changes: Any) -> RunState:
    """A terminal state: no lease, no saved request, no resumable state; the version
    advanced in the same copy (`apply` then leaves it alone).

    The pending-effect markers survive on purpose: an auditor must still see that a write may
    have happened before the run ended.
    """
    return released_state(
        state,
        status,
        has_saved_request=False,
        has_resumable_state=False,
        waiting=None,
        **changes,
    )


def released_state(state: RunState, status: RunStatus, **changes: Any) -> RunState:
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


class RunEvent(BaseModel):
    """Base of every run event. `actor` names whoever appended it (a lease holder, the reaper,
    an operator). Subclasses set `TOPIC` once and forever, and bump `VERSION` with an `upcast`
    when their payload changes shape."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    TOPIC: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1

    actor: str

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.TOPIC:
            if cls.TOPIC in EVENT_TYPES:
                raise TypeError(f"duplicate event topic {cls.TOPIC!r}")
            EVENT_TYPES[cls.TOPIC] = cls

    @classmethod
    def upcast(cls, data: dict[str, Any], from_version: int) -> dict[str, Any]:
        """Turn a stored payload of an older class version into the current shape."""
        raise NotImplementedError(f"{cls.TOPIC} has no upcaster from version {from_version}")

    def apply(self, state: RunState | None) -> RunState:
        """Fold this event onto the state before it (None for a creation event)."""
        raise NotImplementedError

    @staticmethod
    def _require(state: RunState | None) -> RunState:
        if state is None:
            raise IllegalTransition("only a creation event can start a run's history")
        return state


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


def apply(state: RunState | None, event: RunEvent) -> RunState:
    """Fold one event: the event's own rule, then the version advances by one (unless the
    rule advanced it already, as the step's, the claim's and every settle's or release's do
    to save a copy)."""
    new = event.apply(state)
    if state is None:
        return new
    version = state.version + 1
    if new.version == version:
        return new
    return new.evolve(version=version)


def fold(events: Iterable[RunEvent], state: RunState | None = None) -> RunState | None:
    """Fold events in order onto `state` (None: from the beginning)."""
    for event in events:
        state = apply(state, event)
    return state
