"""What an `async def` agent sees of its run: `AsyncRunContext`, shaped like `RunContext`
and sharing all of its logic.

It holds a `RunContext` (the core) and adds only *how to wait*: every part of a step that
touches the segment or the journal — replay lookup, the boundary append before it, the
pending-effect marker of a write tool, the record and journal entry after it, a decision
taken or a suspension — runs as a method of the core on a store thread (`StoreThreads`),
while the step's own callable is awaited on the event loop. (A step's record, which only
touches memory until the next boundary, is kept on the loop when the segment's lock is free
at once; it never waits for it there.) Replay, fencing, the boundary
rule, ambiguity and self-fencing, markers, records, privacy and deadlines are therefore the
sync code path itself, not a copy (ADR 0022); a deadline cancels the awaiting task instead
of abandoning a thread. A step callable may be a coroutine function or a plain one;
whatever awaitable it returns is awaited, so nothing is recorded without having run.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any, TypeVar, overload
from uuid import UUID

from pydantic import BaseModel

from steptrail.domain.decisions import DENIED, PendingCall
from steptrail.domain.enums import PrivacyLevel
from steptrail.domain.run import Decision
from steptrail.workers import rate_limits
from steptrail.workers.children import ChildHandle
from steptrail.workers.context import (
    CallResult,
    LiveStep,
    Recorded,
    Replayed,
    Resumption,
    RunContext,
    StepTimedOut,
    denied_result,
)
from steptrail.workers.store_threads import StoreThreads

T = TypeVar("T")

AwaitingRecordedFn = Callable[[], Awaitable[Recorded[T]]]
AwaitingFn = Callable[[], Awaitable[T]]
PlainFn = Callable[[], T | Recorded[T]]

_CURRENT: ContextVar[AsyncRunContext | None] = ContextVar("steptrail_run_context", default=None)


def current_run_context() -> AsyncRunContext | None:
    """The context of the async agent this task (or a task it started) is running, if any:
    how an integration finds the run to record its steps in."""
    return _CURRENT.get()


class AsyncRunContext:
    """The handle of an async agent on its run. Use it from the agent's task only."""

    def __init__(self, core: RunContext, threads: StoreThreads) -> None:
        self._core = core
        self._threads = threads
        self.request = core.request
        self.resumable = core.resumable
        self.log = core.log

    # -- what the agent can read (the core's) --------------------------------------------------

    @property
    def run_id(self) -> UUID:
        return self._core.run_id

    @property
    def agent(self) -> str:
        return self._core.agent

    @property
    def attempt(self) -> int:
        """1 for the first execution; each requeue or reclaim adds one."""
        return self._core.attempt

    @property
    def fencing_token(self) -> str:
        """`<run id>:<claim version>`, unique to this segment (see `RunContext`)."""
        return self._core.fencing_token

    @property
    def next_seq(self) -> int:
        return self._core.next_seq

    @property
    def idempotency_key(self) -> str:
        """`<run id>:<position>` of the step call now running (see `RunContext`)."""
        return self._core.idempotency_key

    @property
    def replayed(self) -> int:
        """How many step calls of this segment were answered from the journal so far."""
        return self._core.replayed

    @property
    def decision(self) -> Decision | None:
        return self._core.decision

    @property
    def privacy(self) -> PrivacyLevel:
        return self._core.privacy

    @property
    def resumed(self) -> Resumption | None:
        return self._core.resumed

    def activate(self) -> Callable[[], None]:
        """Make this the current run context of the calling task; returns the undo."""
        token = _CURRENT.set(self)
        return lambda: _CURRENT.reset(token)

    @property
    def core(self) -> RunContext:
        """The synchronous context this one awaits through (for integrations)."""
        return self._core

    # -- steps ---------------------------------------------------------------------------------

    # Each step method takes a coroutine function or a plain one; the overloads let a type
    # checker see through either to the value the agent gets.
    @overload
    async def step(
        self,
        kind: str,
        name: str,
        fn: AwaitingRecordedFn[T],
        *,
        payload: Mapping[str, Any] | None = ...,
        args: Any = ...,
        timeout: float | None = ...,
        limit: str | None = ...,
        tokens: int | None = ...,
    ) -> T: ...
    @overload
    async def step(
        self,
        kind: str,
        name: str,
        fn: AwaitingFn[T],
        *,
        payload: Mapping[str, Any] | None = ...,
        args: Any = ...,
        timeout: float | None = ...,
        limit: str | None = ...,
        tokens: int | None = ...,
    ) -> T: ...
    @overload
    async def step(
        self,
        kind: str,
        name: str,
        fn: PlainFn[T],
        *,
        payload: Mapping[str, Any] | None = ...,
        args: Any = ...,
        timeout: float | None = ...,
        limit: str | None = ...,
        tokens: int | None = ...,
    ) -> T: ...
    async def step(
        self,
        kind: str,
        name: str,
        fn: Callable[[], Any],
        *,
        payload: Mapping[str, Any] | None = None,
        args: Any = None,
        timeout: float | None = None,
        limit: str | None = None,
        tokens: int | None = None,
    ) -> Any:
        """Run `fn` as the next step and record it: `RunContext.step` with `fn` awaited.

        A journaled step is replayed without calling `fn`. With a `timeout` (or a default
        from the App), the awaitable `fn` returned is cancelled at the deadline and the step
        fails with `StepTimedOut` (retryable), as a sync step does. `limit` and `tokens` as
        for `RunContext.step` (ADR 0080): a wait for the grant is awaited, not slept.

        Raises:
            LeaseLost: the run was lost or cancelled; nothing more may be recorded.
        """
        opened = await self._threads.call(
            self._core.open_step,
            kind,
            name,
            payload=payload,
            args=args,
            timeout=timeout,
            limit=limit,
            tokens=tokens,
        )
        return await self._run(opened, fn)

    @overload
    async def llm(
        self,
        name: str,
        fn: AwaitingRecordedFn[T],
        *,
        payload: Mapping[str, Any] | None = ...,
        args: Any = ...,
        timeout: float | None = ...,
        limit: str | None = ...,
        tokens: int | None = ...,
    ) -> T: ...
    @overload
    async def llm(
        self,
        name: str,
        fn: AwaitingFn[T],
        *,
        payload: Mapping[str, Any] | None = ...,
        args: Any = ...,
        timeout: float | None = ...,
        limit: str | None = ...,
        tokens: int | None = ...,
    ) -> T: ...
    @overload
    async def llm(
        self,
        name: str,
        fn: PlainFn[T],
        *,
        payload: Mapping[str, Any] | None = ...,
        args: Any = ...,
        timeout: float | None = ...,
        limit: str | None = ...,
        tokens: int | None = ...,
    ) -> T: ...
    async def llm(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        payload: Mapping[str, Any] | None = None,
        args: Any = None,
        timeout: float | None = None,
        limit: str | None = None,
        tokens: int | None = None,
    ) -> Any:
        """`step("llm", …)`: a model call; its return value is recorded as `content`.
        `limit` and `tokens`: its rate limit and estimate (see `RunContext.step`)."""
        return await self.step(
            "llm", name, fn, payload=payload, args=args, timeout=timeout, limit=limit, tokens=tokens
        )

    @overload
    async def tool(
        self,
        name: str,
        fn: AwaitingRecordedFn[T],
        *,
        arguments: Mapping[str, Any] | None = ...,
        timeout: float | None = ...,
        limit: str | None = ...,
        tokens: int | None = ...,
    ) -> T: ...
    @overload
    async def tool(
        self,
        name: str,
        fn: AwaitingFn[T],
        *,
        arguments: Mapping[str, Any] | None = ...,
        timeout: float | None = ...,
        limit: str | None = ...,
        tokens: int | None = ...,
    ) -> T: ...
    @overload
    async def tool(
        self,
        name: str,
        fn: PlainFn[T],
        *,
        arguments: Mapping[str, Any] | None = ...,
        timeout: float | None = ...,
        limit: str | None = ...,
        tokens: int | None = ...,
    ) -> T: ...
    async def tool(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        limit: str | None = None,
        tokens: int | None = None,
    ) -> Any:
        """Run tool `name` as the next step, honouring its declared effect: a write tool's
        pending-effect marker is appended and confirmed before `fn` is even called, and
        its result is appended as soon as it returns (see `RunContext.tool`). `limit` and
        `tokens`: its rate limit and estimate (a write's marker follows the grant)."""
        opened = await self._threads.call(
            self._core.open_tool,
            name,
            arguments=arguments,
            timeout=timeout,
            limit=limit,
            tokens=tokens,
        )
        return await self._run(opened, fn)

    async def heartbeat(self) -> None:
        """Prove the run is still ours now (see `RunContext.heartbeat`)."""
        await self._threads.call(self._core.heartbeat)

    async def _run(self, opened: LiveStep | Replayed, fn: Callable[[], Any]) -> Any:
        if isinstance(opened, Replayed):
            return opened.value
        core = self._core
        if opened.rate is not None:  # its grant: each try on a store thread, waits awaited
            opened = await rate_limits.acquire_async(core, self._threads, opened)
        fn = core.live_callable(opened, fn)
        deactivate = opened.probe.activate()  # in this task: spans the step makes nest
        try:
            outcome = fn()
            if inspect.isawaitable(outcome):
                outcome = await self._awaited(opened, outcome)
        except Exception as error:
            deactivate()
            done, _ = core.close_step_nowait(opened, error=error)
            if not done:
                await self._threads.call(core.close_step, opened, error=error)
            raise
        except BaseException:
            deactivate()
            opened.probe.close()
            raise
        deactivate()
        done, value = core.close_step_nowait(opened, outcome=outcome)
        if done:
            return value
        return await self._threads.call(core.close_step, opened, outcome=outcome)

    async def _awaited(self, step: LiveStep, awaitable: Awaitable[Any]) -> Any:
        """`awaitable`'s outcome; past the step's deadline it is cancelled (ADR 0015)."""
        if step.limit is None:
            return await awaitable
        deadline = asyncio.timeout(step.limit)
        try:
            with self._core.renewing_until(step.limit):
                async with deadline:
                    return await awaitable
        except TimeoutError:
            if not deadline.expired():
                raise  # the step's own TimeoutError, not its deadline
            self.log.warning("step_timed_out", step=step.call.name, timeout_s=step.limit)
            raise StepTimedOut(step.call.name, step.limit) from None

    # -- waiting for time and for outside events (ADR 0073) ------------------------------------

    async def sleep(self, seconds: float, *, name: str = "sleep") -> None:
        """Suspend the run for `seconds` (see `RunContext.sleep`): no lease, no slot, and no
        task waits meanwhile; the agent is called again when the time comes."""
        await self._threads.call(self._core.sleep, seconds, name=name)

    async def sleep_until(self, when: datetime, *, name: str = "sleep") -> None:
        """`sleep` until the timezone-aware instant `when` (see `RunContext.sleep_until`)."""
        await self._threads.call(self._core.sleep_until, when, name=name)

    async def wait_event(self, name: str, *, timeout: float | None = None) -> Any:
        """The payload of the next signal named `name` (see `RunContext.wait_event`)."""
        return await self._threads.call(self._core.wait_event, name, timeout=timeout)

    # -- child runs (ADR 0075) ------------------------------------------------------------------

    async def start_child(
        self, agent: str, request: Mapping[str, Any] | None = None, *, key: str | None = None
    ) -> ChildHandle:
        """Start a run of `agent` as this run's child, exactly once (see
        `RunContext.start_child`)."""
        return await self._threads.call(self._core.start_child, agent, request, key=key)

    async def wait_child(self, handle: ChildHandle, *, timeout: float | None = None) -> Any:
        """The child's result once it settled (see `RunContext.wait_child`)."""
        return await self._threads.call(self._core.wait_child, handle, timeout=timeout)

    async def wait_all(
        self, handles: Sequence[ChildHandle], *, timeout: float | None = None
    ) -> list[Any]:
        """Every child's result, in order (see `RunContext.wait_all`)."""
        return await self._threads.call(self._core.wait_all, handles, timeout=timeout)

    async def wait_any(
        self, handles: Sequence[ChildHandle], *, timeout: float | None = None
    ) -> tuple[ChildHandle, Any]:
        """The first child to settle and its result (see `RunContext.wait_any`)."""
        return await self._threads.call(self._core.wait_any, handles, timeout=timeout)

    # -- waiting for a person ------------------------------------------------------------------

    async def request_approval(
        self,
        calls: Sequence[PendingCall | Mapping[str, Any]],
        *,
        conversation: Any = None,
        timeout: float | None = None,
    ) -> Resumption:
        """Wait until a person approves or denies `calls`; returns the decision once the
        run resumes (the first time, the run suspends here; see `RunContext`)."""
        return await self._threads.call(
            self._core.request_approval, calls, conversation=conversation, timeout=timeout
        )

    async def request_input(
        self,
        schema: type[BaseModel] | Mapping[str, Any],
        *,
        prompt: str | None = None,
        conversation: Any = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Wait until a person submits values matching `schema`; returns them once the run
        resumes (see `RunContext.request_input`)."""
        return await self._threads.call(
            self._core.request_input,
            schema,
            prompt=prompt,
            conversation=conversation,
            timeout=timeout,
        )

    async def run_pending(
        self, tools: Mapping[str, Callable[..., Any]] | Callable[[PendingCall], Any]
    ) -> list[CallResult]:
        """Resolve the calls this segment resumed with (see `RunContext.run_pending`); the
        implementations may be coroutine functions."""
        results = []
        for call, run in self._core.pending_calls(tools):
            if run is None:
                await self.step("tool", call.name, denied_result, payload={"tool": call.name})
                results.append(CallResult(call=call, error=DENIED))
                continue
            value = await self.tool(call.name, run, arguments=call.arguments)
            results.append(CallResult(call=call, value=value))
        return results
