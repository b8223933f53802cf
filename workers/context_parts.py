"""The pieces `RunContext` is made of: what a step returns and raises, what a resumed segment
resumes with, and the helpers that encode a step's outcome for the journal.

Split out of `workers/context.py` when the waits (ADR 0073) grew it past the house limit;
`steptrail.workers.context` re-exports every public name here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic_core import to_jsonable_python

from steptrail.domain.classifier import ClassifiedError
from steptrail.domain.decisions import (
    DENIED,
    PendingCall,
)
from steptrail.domain.enums import (
    Effect,
    FailureClass,
    Outcome,
    TerminationReason,
    WaitKind,
)
from steptrail.domain.journal import (
    JournalEntry,
    ReplayedError,
    StepCall,
)
from steptrail.workers.telemetry import NO_STEP, StepProbe

if TYPE_CHECKING:
    from steptrail.workers.rate_limits import RateClaim

T = TypeVar("T")


@dataclass(frozen=True)
class Recorded(Generic[T]):
    """Return this from a step's callable to record metadata beside its value.

    Args:
        value: what `ctx.step(...)` returns to the agent.
        payload: more of the step to record (filtered by the privacy level).
        tokens: counted into the run's token total.
        cost: counted into the run's cost total.
    """

    value: T
    payload: Mapping[str, Any] = field(default_factory=dict)
    tokens: int = 0
    cost: float = 0.0


class Suspend(BaseException):
    """Raised by `request_approval` / `request_input` once the run is durably waiting; the
    agent function ends there and is called again, resumed, after the decision."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.value)
        self.outcome = outcome


@dataclass(frozen=True)
class Resumption:
    """What a resumed segment resumes with: the decision and the state saved at suspension."""

    kind: WaitKind
    approved: bool
    by: str
    calls: list[PendingCall]
    conversation: Any
    values: dict[str, Any] | None
    # Nobody decided before the wait's `timeout=` passed (ADR 0073): `approved` is False and
    # `by` is the deadline; `request_input` raises WaitTimedOut instead.
    expired: bool = False


@dataclass(frozen=True)
class CallResult:
    """The result of one pending call after the decision: its value, or the denial."""

    call: PendingCall
    value: Any = None
    error: str | None = None


class StepTimedOut(ClassifiedError):
    """A step ran past its deadline; the agent stopped waiting for it (failure class
    `timeout`, retried by the retry ladder). Its thread may still be running: Python cannot
    stop a thread, so whatever it does later is simply never recorded."""

    def __init__(self, name: str, seconds: float) -> None:
        super().__init__(FailureClass.TIMEOUT, f"step {name!r} ran past its {seconds:g} s deadline")


class RunTimedOut(ClassifiedError):
    """The segment ran past its agent's `max_duration`; no further step starts."""

    def __init__(self, seconds: float) -> None:
        super().__init__(FailureClass.TIMEOUT, f"the run ran past its {seconds:g} s maximum")


@dataclass(frozen=True)
class Deadlines:
    """Default step deadlines and the segment's own, in seconds (None: no limit)."""

    step_timeout: float | None = None
    tool_timeout: Callable[[str], float | None] = lambda _name: None
    max_duration: float | None = None


class AwaitableInSyncStep(TypeError):
    """A synchronous agent's step returned an awaitable, which it cannot await: the step
    fails (and the run with it, as not retryable) rather than record something that never
    ran. Write the agent as `async def`; its context awaits steps."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(
            f"the {kind} step {name!r} returned an awaitable in a synchronous agent; "
            "declare the agent `async def` to await it"
        )


@dataclass(frozen=True)
class Replayed:
    """A step call answered from the journal: `value` is what the agent gets."""

    value: Any


@dataclass(frozen=True)
class LiveStep:
    """A step call that runs for real: opened (boundary passed, marker confirmed for a
    write), waiting for its callable's outcome to be closed with."""

    call: StepCall
    payload: Mapping[str, Any] | None
    limit: float | None
    started: float
    write: bool = False
    probe: StepProbe = NO_STEP  # its observer (ADR 0033)
    rate: RateClaim | None = None  # its rate limit's claim and grant (ADR 0080)
    # A rate-limited write tool's pending-effect marker, appended only once the grant is
    # given (ADR 0083): a run never waits, in place or asleep, holding a marker.
    marker: Effect | None = None


class RunFailed(Exception):
    """Raise from an agent to end its run `failed` with `reason`, without any retry."""

    def __init__(self, reason: TerminationReason | str, message: str = "") -> None:
        super().__init__(message or str(reason))
        self.reason = TerminationReason(reason)


def jsonable(value: Any) -> Any:
    """A JSON-compatible form of `value` (unknown objects become their `str`)."""
    return to_jsonable_python(value, fallback=str)


def _error_type(error: BaseException) -> str:
    if isinstance(error, ReplayedError):
        return error.error_type
    return type(error).__name__


def _entry(
    call: StepCall,
    position: int,
    result: Any,
    error: BaseException | None,
    classify_error: Callable[[BaseException], FailureClass],
) -> JournalEntry:
    """The journal entry of a finished step: its value as JSON, or its error."""
    if error is not None:
        message = error.original_message if isinstance(error, ReplayedError) else str(error)
        return JournalEntry(
            0,
            position,
            call.kind,
            call.name,
            call.fingerprint,
            error_type=_error_type(error),
            error_message=message,
            failure_class=classify_error(error),
        )
    value = jsonable(result)
    try:
        return JournalEntry.of_value(position, call, value)
    except ValueError:  # NaN or infinity: JSON has no word for them
        return JournalEntry.of_value(position, call, str(value))


def _replayed(entry: JournalEntry) -> Any:
    if entry.failed:
        raise ReplayedError(entry)
    return entry.value


def _resumption_of(value: Any) -> Resumption:
    return Resumption(
        kind=WaitKind(value["kind"]),
        approved=bool(value["approved"]),
        by=str(value["by"]),
        calls=[PendingCall.model_validate(c) for c in value.get("calls") or []],
        conversation=value.get("conversation"),
        values=value.get("values"),
        expired=bool(value.get("expired", False)),
    )


def _bind(
    tools: Mapping[str, Callable[..., Any]] | Callable[[PendingCall], Any], call: PendingCall
) -> Callable[[], Any]:
    if isinstance(tools, Mapping):
        if call.name not in tools:
            raise KeyError(f"no implementation given for pending call {call.name!r}")
        fn = tools[call.name]
        return lambda: fn(**call.arguments)
    return lambda: tools(call)


def denied_result() -> dict[str, str]:
    """The result a denied pending call is recorded with."""
    return {"error": DENIED}


def _not_awaitable(outcome: T, kind: str, name: str) -> T:
    if inspect.isawaitable(outcome):
        discard_awaitable(outcome)
        raise AwaitableInSyncStep(kind, name)
    return outcome


def discard_awaitable(awaitable: object) -> None:
    """Close a coroutine nobody will await, so it neither runs nor warns."""
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()


def _unwrap(outcome: Any) -> tuple[Any, Recorded[Any] | None]:
    if isinstance(outcome, Recorded):
        return outcome.value, outcome
    return outcome, None
