"""The async facade: `async with steptrail.open_async(app) as rt:` for async web apps.

It is the synchronous `Runtime` awaited, not a second runtime: each use case runs on the
runtime's store threads (ADR 0023) so the caller's event loop never blocks on the store, and
the one place that runs agents — a segment started or resumed here, or a worker's runs —
runs async agents on the caller's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

from steptrail.domain.enums import RunStatus, TerminationReason, WaitKind
from steptrail.domain.limits import ENQUEUE_BATCH
from steptrail.domain.ports import RecordedEvent
from steptrail.infrastructure.settings import Settings
from steptrail.projections.run_index import RunRow
from steptrail.runtime import Runtime, open_runtime
from steptrail.runtime_views import RunRef
from steptrail.workers.decisions import PendingDecision, ResumeMode
from steptrail.workers.execute import SegmentResult
from steptrail.workers.reaper import ReapReport
from steptrail.workers.registry import App
from steptrail.workers.worker import Worker, WorkerReport

P = ParamSpec("P")
T = TypeVar("T")


class AsyncRuntime:
    """A steptrail runtime for use from a running event loop (see the module docstring)."""

    def __init__(self, runtime: Runtime) -> None:
        self.sync = runtime

    @property
    def app(self) -> App:
        return self.sync.app

    @property
    def backend(self) -> str:
        return self.sync.backend

    async def _call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.sync.threads.call(fn, *args, **kwargs)

    # -- use cases (see `Runtime` for each one's contract) ---------------------------------------

    async def enqueue(
        self,
        agent: str,
        request: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        actor: str = "enqueue",
        queue: str | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
    ) -> UUID:
        """Queue a run of `agent`; returns its id (fail-closed, as `Runtime.enqueue`), on
        `queue` at `priority` (default: the agent's; ADR 0077), under `concurrency_key`
        (default: the agent's; ADR 0078)."""
        return await self._call(
            self.sync.enqueue,
            agent,
            request,
            idempotency_key=idempotency_key,
            actor=actor,
            queue=queue,
            priority=priority,
            concurrency_key=concurrency_key,
        )

    async def enqueue_many(
        self,
        items: Iterable[Mapping[str, Any]],
        *,
        actor: str = "enqueue",
        batch: int = ENQUEUE_BATCH,
    ) -> list[UUID]:
        """Queue many runs, validated first, written in batches (as `Runtime.enqueue_many`)."""
        return await self._call(self.sync.enqueue_many, list(items), actor=actor, batch=batch)

    async def start(self, agent: str, request: Mapping[str, Any] | None = None) -> SegmentResult:
        """Run `agent` now as an interactive run; an async agent runs on this loop."""
        run, body, sent = await self._call(self.sync.begin_interactive, agent, request)
        return await self.sync.executor().execute_async(run, body, lease_from=sent)

    async def get(self, run_id: RunRef) -> RunRow:
        return await self._call(self.sync.get, run_id)

    async def history(self, run_id: RunRef) -> list[RecordedEvent]:
        return await self._call(self.sync.history, run_id)

    async def runs(
        self,
        *,
        status: RunStatus | str | None = None,
        agent: str | None = None,
        reason: TerminationReason | str | None = None,
        limit: int = 50,
    ) -> list[RunRow]:
        return await self._call(
            self.sync.runs, status=status, agent=agent, reason=reason, limit=limit
        )

    async def cancel(
        self, run_id: RunRef, *, by: str = "operator", note: str | None = None
    ) -> RunRow:
        return await self._call(self.sync.cancel, run_id, by=by, note=note)

    async def set_priority(self, run_id: UUID, priority: int, *, by: str = "operator") -> RunRow:
        """Change a queued or waiting run's claim priority (as `Runtime.set_priority`)."""
        return await self._call(self.sync.set_priority, run_id, priority, by=by)

    async def reap(self, limit: int = 50) -> ReapReport:
        return await self._call(self.sync.reap, limit)

    async def pending(self, run_id: RunRef) -> PendingDecision:
        return await self._call(self.sync.pending, run_id)

    async def approve(
        self, run_id: RunRef, *, by: str, digest: str | None = None, resume: ResumeMode = "auto"
    ) -> SegmentResult:
        """Approve the pending calls and resume the run (`resume="here"`: on this loop)."""
        return await self._decide(
            run_id, by=by, kind=WaitKind.APPROVAL, approved=True, digest=digest, resume=resume
        )

    async def deny(
        self, run_id: RunRef, *, by: str, digest: str | None = None, resume: ResumeMode = "auto"
    ) -> SegmentResult:
        """Deny the pending calls; each gets the error result and the agent goes on."""
        return await self._decide(
            run_id, by=by, kind=WaitKind.APPROVAL, approved=False, digest=digest, resume=resume
        )

    async def submit_input(
        self, run_id: RunRef, values: Mapping[str, Any], *, by: str, resume: ResumeMode = "auto"
    ) -> SegmentResult:
        """Submit input to a run waiting for it (validated before anything changes)."""
        return await self._decide(
            run_id, by=by, kind=WaitKind.INPUT, approved=True, values=values, resume=resume
        )

    async def _decide(self, run_id: RunRef, **decision: Any) -> SegmentResult:
        run_id = await self._call(self.sync.resolve, run_id)
        handed = await self._call(self.sync.decisions().record, run_id, **decision)
        if isinstance(handed, SegmentResult):
            return handed
        executor = self.sync.executor()
        return await executor.execute_async(
            handed.run, handed.request, resumable=handed.resumable, lease_from=handed.lease_from
        )

    # -- workers ---------------------------------------------------------------------------------

    def worker(
        self, *, concurrency: int = 1, burst: bool = False, queues: Iterable[str] | None = None
    ) -> Worker:
        """A worker whose async runs share this event loop (its claims and threaded runs
        use threads of their own), of `queues` only if given (as `Runtime.worker`). Run it
        with `await rt.run_worker(worker)`."""
        return self.sync.worker(
            concurrency=concurrency, burst=burst, loop=asyncio.get_running_loop(), queues=queues
        )

    async def work(
        self, *, concurrency: int = 1, burst: bool = False, queues: Iterable[str] | None = None
    ) -> WorkerReport:
        """Claim and execute runs until stopped (burst: until no run is ready); async
        agents run as tasks of this loop, at most `concurrency` runs at once."""
        return await self.run_worker(
            self.worker(concurrency=concurrency, burst=burst, queues=queues)
        )

    async def run_worker(self, worker: Worker) -> WorkerReport:
        """Run `worker` until it stops. Cancelling the awaiting task stops it gracefully:
        no new claims, runs in flight finish, then the cancellation goes on."""
        done = asyncio.get_running_loop().run_in_executor(None, worker.run)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            worker.stop()
            await done
            raise

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)


@asynccontextmanager
async def open_async(
    app: App | None = None,
    *,
    url: str | None = None,
    settings: Settings | None = None,
    **overrides: Any,
) -> AsyncIterator[AsyncRuntime]:
    """Open an async runtime (arguments as `steptrail.open`), closed when the block ends.

    Example:
        ```python
        async with steptrail.open_async(app) as rt:
            run_id = await rt.enqueue("research", {"topic": "..."})
            await rt.work(burst=True, concurrency=100)
            print((await rt.get(run_id)).status)
        ```
    """
    runtime = await asyncio.to_thread(open_runtime, app, url=url, settings=settings, **overrides)
    try:
        yield AsyncRuntime(runtime)
    finally:
        await asyncio.to_thread(runtime.close)
