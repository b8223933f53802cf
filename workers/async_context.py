"""What an `async def` agent sees of its run: `AsyncRunContext`, the awaitable twin-in-
shape of `RunContext` that shares all of its logic.

It holds a `RunContext` (the core) and adds only *how to wait*: every part of a step that
touches the segment — the boundary append before it, the pending-effect marker of a write
tool, the record after it, a suspension — runs as a method of the core on a store thread
(`StoreThreads`), while the step's own callable is awaited on the event loop. Fencing, the
boundary rule, ambiguity and self-fencing, markers, records and privacy are therefore the
sync code path itself, not a copy (ADR 0022). A step callable may be a coroutine function or
a plain one; whatever awaitable it returns is awaited, so nothing is recorded without
having run.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Never, TypeVar
from uuid import UUID

from pydantic import BaseModel

from steptrail.domain.decisions import DENIED, PendingCall
from steptrail.domain.enums import PrivacyLevel
from steptrail.domain.run import Decision
from steptrail.workers.context import (
    CallResult,
    Recorded,
    Resumption,
    RunContext,
    denied_result,
)
from steptrail.workers.store_threads import StoreThreads

T = TypeVar("T")

StepFn = Callable[[], Awaitable[T | Recorded[T]] | T | Recorded[T]]

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

    async def step(
        self,
        kind: str,
        name: str,
        fn: StepFn[T],
        *,
        payload: Mapping[str, Any] | None = None,
    ) -> T:
        """Run `fn` as the next step and record it; `RunContext.step` with `fn` awaited.

        Raises:
            LeaseLost: the run was lost or cancelled; nothing more may be recorded.
        """
        core, call = self._core, self._threads.call
        started = await call(core.begin_step, kind, name)
        try:
            outcome = fn()
            if inspect.isawaitable(outcome):
                outcome = await outcome
        except Exception as error:
            await call(core.end_step, kind, name, started, payload=payload, error=error)
            raise
        value: T = await call(core.end_step, kind, name, started, payload=payload, outcome=outcome)
        return value

    async def llm(self, name: str, fn: StepFn[T], *, payload: Mapping[str, Any] | None = None) -> T:
        """`step("llm", …)`: a model call; its return value is recorded as `content`."""
        return await self.step("llm", name, fn, payload=payload)

    async def tool(
        self, name: str, fn: StepFn[T], *, arguments: Mapping[str, Any] | None = None
    ) -> T:
        """Run tool `name` as the next step, honouring its declared effect: a write tool's
        pending-effect marker is appended and confirmed before `fn` is even called."""
        payload = await self._threads.call(self._core.prepare_tool, name, arguments)
        return await self.step("tool", name, fn, payload=payload)

    async def heartbeat(self) -> None:
        """Prove the run is still ours now (see `RunContext.heartbeat`)."""
        await self._threads.call(self._core.heartbeat)

    # -- waiting for a person ------------------------------------------------------------------

    async def request_approval(
        self, calls: Sequence[PendingCall | Mapping[str, Any]], *, conversation: Any = None
    ) -> Never:
        """Suspend until a person approves or denies `calls` (see `RunContext`)."""
        await self._threads.call(self._core.request_approval, calls, conversation=conversation)
        raise AssertionError("request_approval returned without suspending")  # pragma: no cover

    async def request_input(
        self,
        schema: type[BaseModel] | Mapping[str, Any],
        *,
        prompt: str | None = None,
        conversation: Any = None,
    ) -> Never:
        """Suspend until a person submits values matching `schema` (see `RunContext`)."""
        await self._threads.call(
            self._core.request_input, schema, prompt=prompt, conversation=conversation
        )
        raise AssertionError("request_input returned without suspending")  # pragma: no cover

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
