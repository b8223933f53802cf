"""What an agent sees of its run: `RunContext`, the handle for recording steps and tools.

Every recorded step is an append fenced on the run's version, and so also the heartbeat. A
step's callable runs first and is recorded after it returns (or raises); if the record
cannot be appended because the run was lost or cancelled, `LeaseLost` propagates and the
agent stops with nothing more recorded. Before a write tool runs, a pending-effect marker is
appended under the same fence; a write tool never runs without it.

Steps carry their sequence number, and their records are shaped so that a later version can
hand a completed step's recorded result back instead of running it again (durable replay).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Never, TypeVar
from uuid import UUID

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from steptrail.domain.decisions import (
    DENIED,
    PendingCall,
    ResumableState,
    calls_digest,
    state_digest,
)
from steptrail.domain.digest import canonical_json
from steptrail.domain.enums import Effect, Outcome, PrivacyLevel, TerminationReason, WaitKind
from steptrail.domain.privacy import filter_payload
from steptrail.domain.run import Decision, Run
from steptrail.workers.segment import LeaseLost, Segment

T = TypeVar("T")


@dataclass(frozen=True)
class Recorded(Generic[T]):
    """Return this from a step's callable to record metadata beside its value.

    Args:
        value: what `ctx.step(...)` returns to the agent.
        payload: more of the step to record (filtered by the privacy level).
        tokens / cost: counted into the run's totals.
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


@dataclass(frozen=True)
class CallResult:
    """The result of one pending call after the decision: its value, or the denial."""

    call: PendingCall
    value: Any = None
    error: str | None = None


class AwaitableInSyncStep(TypeError):
    """A synchronous agent's step returned an awaitable, which it cannot await: the step
    fails (and the run with it, as not retryable) rather than settle something that never
    ran. Write the agent as `async def`; its context awaits steps."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(
            f"the {kind} step {name!r} returned an awaitable in a synchronous agent; "
            "declare the agent `async def` to await it"
        )


class RunFailed(Exception):
    """Raise from an agent to end its run `failed` with `reason`, without any retry."""

    def __init__(self, reason: TerminationReason | str, message: str = "") -> None:
        super().__init__(message or str(reason))
        self.reason = TerminationReason(reason)


def jsonable(value: Any) -> Any:
    """A JSON-compatible form of `value` (unknown objects become their `str`)."""
    return to_jsonable_python(value, fallback=str)


class RunContext:
    """The agent's handle on its run. Not thread-safe: use it from the agent's thread."""

    def __init__(
        self,
        segment: Segment,
        *,
        request: dict[str, Any],
        privacy: PrivacyLevel,
        effect_of: Callable[[str], Effect],
        resumable: dict[str, Any] | None = None,
    ) -> None:
        self._segment = segment
        self._privacy = privacy
        self._effect_of = effect_of
        self.request = request
        self.resumable = resumable
        self.log = segment.log

    # -- what the agent can read ---------------------------------------------------------------

    @property
    def run_id(self) -> UUID:
        return self._segment.run.id

    @property
    def agent(self) -> str:
        return self._segment.run.state.agent

    @property
    def attempt(self) -> int:
        """1 for the first execution; each requeue or reclaim adds one."""
        return self._segment.run.state.requeue_count + 1

    @property
    def fencing_token(self) -> str:
        """`<run id>:<claim version>`, unique to this segment: use it (with the step number)
        as the idempotency key of calls to the outside world."""
        return self._segment.fencing_token

    @property
    def next_seq(self) -> int:
        """The sequence number the next step will be recorded under."""
        return self._segment.run.state.steps + 1

    @property
    def decision(self) -> Decision | None:
        """The human decision this segment resumed with, if it is a resumed segment."""
        return self._segment.run.state.decision

    @property
    def privacy(self) -> PrivacyLevel:
        return self._privacy

    @property
    def resumed(self) -> Resumption | None:
        """Set when this segment resumes a run after a person decided; None otherwise."""
        decision = self.decision
        if decision is None or self.resumable is None:
            return None
        saved = ResumableState.model_validate(self.resumable)
        return Resumption(
            kind=decision.kind,
            approved=decision.approved,
            by=decision.by,
            calls=saved.calls,
            conversation=saved.conversation,
            values=saved.values,
        )

    # -- waiting for a person ------------------------------------------------------------------

    def request_approval(
        self, calls: Sequence[PendingCall | Mapping[str, Any]], *, conversation: Any = None
    ) -> Never:
        """Stop and wait until a person approves or denies `calls`.

        The pending calls and `conversation` are saved verbatim (whatever the privacy level)
        and the lease is released; the agent function ends here. After the decision it is
        called again with `ctx.resumed` set: run the calls with `ctx.run_pending(...)`.
        """
        pending = [PendingCall.model_validate(c) for c in calls]
        if not pending:
            raise ValueError("request_approval needs at least one pending call")
        state = ResumableState(kind=WaitKind.APPROVAL, calls=pending, conversation=conversation)
        self._suspend(state, calls_digest(pending), tuple(c.name for c in pending))

    def request_input(
        self,
        schema: type[BaseModel] | Mapping[str, Any],
        *,
        prompt: str | None = None,
        conversation: Any = None,
    ) -> Never:
        """Stop and wait until a person submits values matching `schema` (a pydantic model
        or a JSON Schema); they arrive as `ctx.resumed.values`."""
        json_schema = (
            schema.model_json_schema()
            if isinstance(schema, type) and issubclass(schema, BaseModel)
            else dict(schema)
        )
        state = ResumableState(
            kind=WaitKind.INPUT,
            input_schema=json_schema,
            prompt=prompt,
            conversation=conversation,
        )
        self._suspend(state, state_digest(state), ())

    def run_pending(
        self, tools: Mapping[str, Callable[..., Any]] | Callable[[PendingCall], Any]
    ) -> list[CallResult]:
        """Resolve the calls this segment resumed with.

        Approved: each call runs as a tool step (`ctx.tool`, so write tools get their
        pending-effect marker first), with `tools[name](**arguments)` or `tools(call)`.
        Denied: no call runs; each gets the error result "denied by the operator", recorded
        as a step, and the agent goes on.
        """
        results = []
        for call, run in self.pending_calls(tools):
            if run is None:
                self.step("tool", call.name, denied_result, payload={"tool": call.name})
                results.append(CallResult(call=call, error=DENIED))
                continue
            value = self.tool(call.name, run, arguments=call.arguments)
            results.append(CallResult(call=call, value=value))
        return results

    def pending_calls(
        self, tools: Mapping[str, Callable[..., Any]] | Callable[[PendingCall], Any]
    ) -> list[tuple[PendingCall, Callable[[], Any] | None]]:
        """The calls this segment resumed with, each with what runs it (None: denied)."""
        resumed = self.resumed
        if resumed is None or resumed.kind is not WaitKind.APPROVAL:
            raise RuntimeError("run_pending is for a segment resumed after an approval")
        return [(c, _bind(tools, c) if resumed.approved else None) for c in resumed.calls]

    def _suspend(self, state: ResumableState, digest: str, tools: tuple[str, ...]) -> Never:
        body = canonical_json(jsonable(state.model_dump(mode="json")))
        kind = state.kind

        def suspend(run: Run) -> None:
            run.suspend(
                kind=kind, digest=digest, pending_tools=tools, input_schema=state.input_schema
            )

        try:
            self._segment.commit(suspend, resumable=body)
        except LeaseLost as lost:
            # A cancel (or a takeover) won the race: the run was not suspended. First outcome
            # wins, so it stays as the canceller left it; this segment reports suspend_failed.
            if lost.outcome is Outcome.CANCELLED:
                raise LeaseLost(Outcome.SUSPEND_FAILED, lost.why) from lost
            raise
        self.log.info("run_suspended", waiting_for=kind.value, version=self._segment.run.version)
        raise Suspend(
            Outcome.AWAITING_APPROVAL if kind is WaitKind.APPROVAL else Outcome.AWAITING_INPUT
        )

    # -- steps ---------------------------------------------------------------------------------

    def step(
        self,
        kind: str,
        name: str,
        fn: Callable[[], T | Recorded[T]],
        *,
        payload: Mapping[str, Any] | None = None,
    ) -> T:
        """Run `fn` as the next step and record it (kind, name, duration, payload, result).

        First the step boundary: whatever is pending (the previous step's record) is
        appended, fenced, so `fn` only runs while the run is provably this segment's. The
        step's own record is appended at the next boundary (the next step, a write tool, or
        the settle). If `fn` raises, the step is recorded with the exception's class (never
        its message) and the exception goes on. `fn` must not return an awaitable: in a
        synchronous agent it could not be awaited, so the step fails with `AwaitableInSyncStep`
        (use an `async def` agent, whose context awaits it).

        Raises:
            LeaseLost: the run was lost or cancelled; nothing more may be recorded.
        """
        started = self.begin_step(kind, name)
        try:
            outcome = _not_awaitable(fn(), kind, name)
        except Exception as error:
            self.end_step(kind, name, started, payload=payload, error=error)
            raise
        value: T = self.end_step(kind, name, started, payload=payload, outcome=outcome)
        return value

    # The two halves of a step, shared by this context and the async one (workers/
    # async_context.py), which runs them on a store thread and awaits `fn` between them: one
    # implementation of boundaries, fencing and records for both (ADR 0022).

    def begin_step(self, kind: str, name: str) -> float:
        """The step boundary before a step's callable runs; returns its start time.

        Raises:
            LeaseLost: the run was lost or cancelled.
        """
        self._segment.boundary()
        return time.perf_counter()

    def end_step(
        self,
        kind: str,
        name: str,
        started: float,
        *,
        payload: Mapping[str, Any] | None = None,
        outcome: Any = None,
        error: BaseException | None = None,
    ) -> Any:
        """Record the step that began at `started` (appended at the next boundary) and
        return the value the agent gets: `outcome` unwrapped from `Recorded`."""
        if error is not None:
            self._record(
                kind=kind, name=name, started=started, payload=payload, extra=None, error=error
            )
            return None
        value, extra = _unwrap(outcome)
        self._record(
            kind=kind,
            name=name,
            started=started,
            payload=payload,
            extra=extra,
            error=None,
            result=value,
        )
        return value

    def llm(
        self,
        name: str,
        fn: Callable[[], T | Recorded[T]],
        *,
        payload: Mapping[str, Any] | None = None,
    ) -> T:
        """`step("llm", …)`: a model call; its return value is recorded as `content`."""
        return self.step("llm", name, fn, payload=payload)

    def tool(
        self,
        name: str,
        fn: Callable[[], T | Recorded[T]],
        *,
        arguments: Mapping[str, Any] | None = None,
    ) -> T:
        """Run tool `name` as the next step, honouring its declared effect.

        A write tool (idempotent or not, or any tool nobody declared) first appends a
        pending-effect marker under the lease; only once that is confirmed does `fn` run.
        The marker is cleared by the step that records the tool's result; if the tool raises,
        the marker stays, because the write may have happened.
        """
        payload = self.prepare_tool(name, arguments)
        return self.step("tool", name, fn, payload=payload)

    def prepare_tool(self, name: str, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
        """What comes before a tool's step: for a write tool, its pending-effect marker,
        appended and confirmed. Returns the step's payload (tool, effect, arguments)."""
        effect = self._effect_of(name)
        payload: dict[str, Any] = {"tool": name, "effect": effect.value}
        if arguments is not None:
            payload["arguments"] = dict(arguments)
        if effect.is_write:
            seq = self._segment.commit(
                lambda run: run.mark_effect_pending(tool=name, effect=effect)
            )
            self.log.info("effect_pending", tool=name, effect=effect.value, seq=seq)
        return payload

    def heartbeat(self) -> None:
        """Prove the run is still ours now: append what is pending, or renew the lease.
        (The lease keeper does this on its own a third of the way to expiry.)"""
        segment = self._segment
        with segment.lock:
            if segment.run.pending_events:
                segment.boundary()
            else:
                segment.commit(lambda run: run.renew_lease())

    # -- internals -----------------------------------------------------------------------------

    def _record(
        self,
        *,
        kind: str,
        name: str,
        started: float,
        payload: Mapping[str, Any] | None,
        extra: Recorded[Any] | None,
        error: BaseException | None,
        result: Any = None,
    ) -> None:
        duration_ms = int((time.perf_counter() - started) * 1000)
        body: dict[str, Any] = dict(payload or {})
        tokens, cost = 0, 0.0
        if extra is not None:
            body.update(extra.payload)
            tokens, cost = extra.tokens, extra.cost
        if error is None:
            body["content" if kind == "llm" else "result"] = result
        filtered = filter_payload(jsonable(body), self._privacy)
        error_type = type(error).__name__ if error is not None else None

        def record(run: Run) -> int:
            return run.record_step(
                kind=kind,
                name=name,
                duration_ms=duration_ms,
                payload=filtered,
                privacy=self._privacy,
                error_type=error_type,
                tokens=tokens,
                cost=cost,
            )

        self._segment.defer(record)


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
