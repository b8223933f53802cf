"""Executing one segment of a run: call the agent, then settle by the rules of the brief.

Settling is an append like any other, fenced on the segment's version, so the first outcome
wins: a settle that conflicts changes nothing and reports how the run was lost instead.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

import structlog
from pydantic import ValidationError

from steptrail.domain.classifier import Classifier
from steptrail.domain.decisions import ResumableState, state_digest
from steptrail.domain.enums import FailureClass, Outcome, PrivacyLevel, RunStatus
from steptrail.domain.errors import (  # re-exported: it was defined here before ADR 0051
    CorruptResumableState as CorruptResumableState,  # noqa: PLC0414
)
from steptrail.domain.errors import StoreUnavailable
from steptrail.domain.journal import JournalCursor, JournalEntry, NonDeterministic, ReplayedError
from steptrail.domain.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_REQUEST_BYTES,
    PayloadRejected,
    check_depth,
)
from steptrail.domain.ports import RunStore
from steptrail.domain.privacy import filter_payload
from steptrail.domain.retry import DeadLetter, Fail, Requeue, RetryPolicy
from steptrail.domain.run import Run
from steptrail.workers import run_limits
from steptrail.workers.async_context import AsyncRunContext
from steptrail.workers.children import Spawner, stricter
from steptrail.workers.context import (
    Deadlines,
    RunContext,
    RunFailed,
    Suspend,
    discard_awaitable,
    jsonable,
)
from steptrail.workers.lease import LeaseKeeper
from steptrail.workers.registry import AgentSpec, App
from steptrail.workers.segment import LeaseLost, NextClaim, Segment
from steptrail.workers.store_threads import StoreThreads
from steptrail.workers.telemetry import NO_TELEMETRY, Telemetry

T = TypeVar("T")


@dataclass(frozen=True)
class SegmentResult:
    """How a segment ended, for its caller. `status` is the run's as this segment left it
    (or, when the run was lost, as far as the segment knows)."""

    run_id: UUID
    outcome: Outcome
    status: RunStatus
    version: int
    result: Any = None


@dataclass(frozen=True)
class ExecutionConfig:
    lease_s: float
    policy: RetryPolicy
    privacy: PrivacyLevel
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES


class AwaitableAgent(TypeError):
    """A synchronous agent function returned an awaitable (say, a plain function wrapping an
    `async def` one). It is never settled as if it had run: the run fails, not retryable.
    Register the `async def` function itself, so the worker awaits it."""

    def __init__(self, agent: str) -> None:
        super().__init__(
            f"agent {agent!r} returned an awaitable from a synchronous function; register "
            "an `async def` agent so that steptrail awaits it"
        )


class Executor:
    """Runs claimed (or started, or resumed) segments to their outcome.

    Synchronous agents run in the calling thread (`execute`); async agents run as a
    coroutine (`execute_async`) whose store calls go to `threads`. Both open their segment
    with `_open` and settle through `conclude`, so there is one implementation of how a
    segment starts and ends (ADR 0022).
    """

    # The context an agent gets; the testing kit substitutes one that injects faults.
    context_class: type[RunContext] = RunContext

    def __init__(
        self,
        store: RunStore,
        app: App,
        config: ExecutionConfig,
        *,
        keeper: LeaseKeeper,
        log: structlog.typing.FilteringBoundLogger,
        rng: random.Random | None = None,
        threads: StoreThreads | None = None,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self.store = store
        self.telemetry = telemetry
        self.app = app
        self.config = config
        self.keeper = keeper
        self.log = log
        self.rng = rng or random.Random()
        self.classifier: Classifier = app.classifier
        self.threads = threads or StoreThreads()

    def execute(
        self,
        run: Run,
        request: dict[str, Any],
        *,
        resumable: dict[str, Any] | None = None,
        lease_from: float | None = None,
        next_claim: NextClaim | None = None,
        journal: Sequence[JournalEntry] | None = None,
    ) -> SegmentResult:
        """Run the agent of `run` (held by this process) and settle it. `lease_from` is
        when the write that gave this process the lease was sent (`time.monotonic()`).
        With `next_claim`, the settle also claims the worker's next run (ADR 0058; a
        synchronous agent's only: an async one settles as usual). `journal`: the run's
        journal as its claim read it (ADR 0086); None: the segment reads it.

        An async agent runs to its end on a private event loop in this thread; from a thread
        that already runs a loop, await `execute_async` instead.
        """
        spec = self.app.get(run.state.agent)
        if spec.is_async:
            return run_to_end(
                self.execute_async(
                    run, request, resumable=resumable, lease_from=lease_from, journal=journal
                )
            )
        opened = self._open(spec, run, request, resumable, lease_from, journal=journal)
        if isinstance(opened, SegmentResult):
            return opened
        segment, ctx = opened
        segment.next_claim = next_claim
        settled: SegmentResult | None = None
        deactivate = segment.probe.activate()
        try:
            try:
                run_limits.admit(ctx, spec)  # its run-level rate limit first (ADR 0083)
                result = _not_awaitable(spec.fn(ctx, ctx.request), spec.name)  # type: ignore[arg-type]
            # Any agent error goes to the retry ladder; LeaseLost and Suspend end the segment.
            except (LeaseLost, Suspend, Exception) as error:  # noqa: BLE001
                settled = self.conclude(segment, ctx, error=error)
                return settled
            settled = self.conclude(segment, ctx, result=result)
            return settled
        finally:
            deactivate()
            self._close(segment, settled)

    async def execute_async(
        self,
        run: Run,
        request: dict[str, Any],
        *,
        resumable: dict[str, Any] | None = None,
        lease_from: float | None = None,
        journal: Sequence[JournalEntry] | None = None,
    ) -> SegmentResult:
        """Run the agent of `run` as a coroutine on the running loop and settle it. Every
        store call (the journal read, appends, the settle) runs on `self.threads`; the loop
        never blocks on the store. A synchronous agent runs on a thread of its own (not a
        store thread: it may take minutes)."""
        spec = self.app.get(run.state.agent)
        if not spec.is_async:
            return await asyncio.to_thread(
                self.execute,
                run,
                request,
                resumable=resumable,
                lease_from=lease_from,
                journal=journal,
            )
        if run.state.steps and journal is None:  # reads its journal: a store call
            opened = await self.threads.call(self._open, spec, run, request, resumable, lease_from)
        else:  # no journal, or the claim's: nothing here touches the store
            opened = self._open(spec, run, request, resumable, lease_from, journal=journal)
        if isinstance(opened, SegmentResult):
            return opened
        segment, core = opened
        ctx = AsyncRunContext(core, self.threads)
        deactivate = ctx.activate()
        unobserve = segment.probe.activate()  # in this task, around the agent
        settled: SegmentResult | None = None
        try:
            try:
                await run_limits.admit_async(ctx, spec)  # as in `execute` (ADR 0083)
                result = spec.fn(ctx, ctx.request)  # type: ignore[arg-type]
                if inspect.isawaitable(result):
                    result = await result
            except (LeaseLost, Suspend, Exception) as error:  # noqa: BLE001 - as in `execute`
                settled = await self.threads.call(self.conclude, segment, core, error=error)
                return settled
            settled = await self.threads.call(self.conclude, segment, core, result=result)
            return settled
        finally:
            unobserve()
            deactivate()
            self._close(segment, settled)

    def _open(
        self,
        spec: AgentSpec,
        run: Run,
        request: dict[str, Any],
        resumable: dict[str, Any] | None,
        lease_from: float | None,
        *,
        journal: Sequence[JournalEntry] | None = None,
    ) -> tuple[Segment, RunContext] | SegmentResult:
        """The segment and its context, ready to run the agent; or, when the journal cannot
        be read, the result of a segment that never started."""
        # A child run keeps its parent's level where that is stricter (ADR 0075).
        privacy = stricter(spec.privacy or self.config.privacy, run.state.parent_privacy)
        segment = Segment(
            self.store, run, lease_s=self.config.lease_s, log=self.log, lease_from=lease_from
        )
        try:
            # A run that recorded no step has no journal: a fresh claim costs no extra read;
            # nor does one whose claim brought its journal along (ADR 0086).
            if journal is None:
                journal = self.store.journal(run.id) if run.state.steps else ()
            woke = run.state.woke  # a failure the agent caught before a wait replays
            cursor = JournalCursor(journal, waited_at=woke.seq if woke is not None else None)
        except StoreUnavailable as error:
            # Without its journal the agent would run recorded steps again: do not start.
            # The lease runs out and the reaper hands the run to another segment.
            segment.log.warning("journal_unreadable", error=type(error).__name__)
            return self._result(segment, Outcome.LEASE_LOST)
        ctx = self.context_class(
            segment,
            request=request,
            privacy=privacy,
            effect_of=self.app.effect_of,
            resumable=resumable,
            max_payload_bytes=self.config.max_payload_bytes,
            declared_tools=self.app.declared_tools,
            journal=cursor,
            classify=self.classifier,
            deadlines=Deadlines(
                step_timeout=spec.step_timeout,
                tool_timeout=self.app.timeout_of,
                max_duration=spec.max_duration,
            ),
            rate_limits=self.app.rate_limits,
            spawner=Spawner(self.app, self.config.max_request_bytes),
        )
        segment.probe = self.telemetry.segment_started(run)
        self.keeper.track(segment)
        return segment, ctx

    def _close(self, segment: Segment, settled: SegmentResult | None) -> None:
        """The segment is over: `settled` is how (None: steptrail itself failed)."""
        self.keeper.untrack(segment)
        segment.close()
        segment.probe.ended(settled.outcome if settled is not None else None)

    def conclude(
        self,
        segment: Segment,
        ctx: RunContext,
        *,
        result: Any = None,
        error: BaseException | None = None,
    ) -> SegmentResult:
        """Settle the segment after its agent returned `result` or raised `error`."""
        run = segment.run
        privacy = ctx.privacy
        if isinstance(error, LeaseLost):
            return self._result(segment, error.outcome)
        if isinstance(error, Suspend):
            return self._result(segment, error.outcome)
        if isinstance(error, RunFailed):
            if ctx.diverged is not None:  # a replay mismatch outranks what the agent made of it
                return self._on_failure(segment, ctx, ctx.diverged)
            reason, error_type = error.reason, type(error).__name__
            ctx.note_replay()
            return self._settle(
                segment, lambda r: r.fail(reason=reason, error_type=error_type), Outcome.FAILED
            )
        if isinstance(error, Exception):
            return self._on_failure(segment, ctx, ctx.diverged or error)
        if error is not None:
            raise error
        if segment.lost is not None:
            return self._result(segment, segment.lost.outcome)
        if ctx.diverged is not None:  # the agent swallowed the mismatch; the run still fails
            return self._on_failure(segment, ctx, ctx.diverged)
        ctx.note_replay()
        try:
            # A result that could not be read back must never be written (ADR 0019): the
            # run fails instead, not retryable (it would return the same result again).
            check_depth(result, "the run's result")
            body = filter_payload(jsonable({"result": result}), privacy)
            ctx.check_size(body, "the run's result")
        except PayloadRejected as rejected:
            return self._on_failure(segment, ctx, rejected)
        # A child hands its parent the verbatim result with its settle (ADR 0075).
        run.for_parent = jsonable(result) if run.state.parent_id is not None else None
        settled = self._settle(
            segment, lambda r: r.complete(result=body, privacy=privacy), Outcome.COMPLETED
        )
        if settled.outcome is Outcome.COMPLETED:
            segment.log.info("run_completed", version=run.version)
            return SegmentResult(run.id, Outcome.COMPLETED, run.status, run.version, result)
        return settled

    def _on_failure(self, segment: Segment, ctx: RunContext, error: Exception) -> SegmentResult:
        """The retry ladder: dead-letter, requeue with backoff, or fail (ADR 0006)."""
        run = segment.run
        ctx.note_replay()
        failure_class: FailureClass = self.classifier(error)
        # A recorded error raised again on replay keeps the class name it was recorded with.
        error_type = error.error_type if isinstance(error, ReplayedError) else type(error).__name__
        segment.probe.failed(failure_class.value, error_type)
        decision = self.config.policy.on_failure(run.state, failure_class, self.rng.random())
        log = segment.log.bind(failure_class=failure_class.value, error_type=error_type)
        if isinstance(error, NonDeterministic):
            # Step kinds and names are metadata, never content: the trail may say which.
            log.warning(
                "replay_diverged",
                position=error.position,
                expected=error.expected.describe(),
                found=error.found.describe(),
            )
            if isinstance(decision, DeadLetter):
                decision = DeadLetter(decision.reason, f"non_deterministic: {error}")
        if isinstance(decision, Requeue):
            result = self._settle(
                segment,
                lambda r: r.requeue(
                    delay_ms=decision.delay_ms,
                    failure_class=failure_class,
                    error_type=error_type,
                ),
                Outcome.REQUEUED,
            )
            if result.outcome is Outcome.REQUEUED:
                log.info(
                    "run_requeued",
                    version=run.version,
                    delay_ms=decision.delay_ms,
                    requeue_count=run.state.requeue_count,
                )
            return result
        if isinstance(decision, DeadLetter):
            result = self._settle(
                segment,
                lambda r: r.dead_letter(
                    actor=segment.holder,
                    reason=decision.reason,
                    cause=decision.cause,
                    failure_class=failure_class,
                    error_type=error_type,
                ),
                Outcome.FAILED,
            )
            if result.outcome is Outcome.FAILED:
                log.warning(
                    "run_dead_lettered",
                    reason=decision.reason.value,
                    cause=decision.cause,
                    version=run.version,
                )
            return result
        assert isinstance(decision, Fail)
        result = self._settle(
            segment,
            lambda r: r.fail(
                reason=decision.reason, failure_class=failure_class, error_type=error_type
            ),
            Outcome.FAILED,
        )
        if result.outcome is Outcome.FAILED:
            log.warning("run_failed", reason=decision.reason.value, version=run.version)
        return result

    def _settle(self, segment: Segment, command: Any, outcome: Outcome) -> SegmentResult:
        try:
            segment.commit(command)
        except LeaseLost as lost:
            return self._result(segment, lost.outcome)
        return self._result(segment, outcome)

    @staticmethod
    def _result(segment: Segment, outcome: Outcome) -> SegmentResult:
        run = segment.run
        status = (
            RunStatus.CANCELLED
            if outcome in (Outcome.CANCELLED, Outcome.SUSPEND_FAILED)
            else run.status
        )
        return SegmentResult(run.id, outcome, status, run.committed_version)


def has_resumable(run: Run) -> bool:
    """Whether `resumable_of` has state to read for `run` (a store call)."""
    return run.state.decision is not None and run.state.has_resumable_state


def resumable_of(store: RunStore, run: Run) -> dict[str, Any] | None:
    """The saved resumable state a decided run resumes with, or None for a fresh segment.

    The state is read again when the resumed segment starts (a worker picked the run off the
    queue, maybe hours after the decision), so it is checked again against the digest the
    decision was bound to: calls changed in the database since the approval must not run.

    Raises:
        CorruptResumableState: unreadable, or not what the decision was about.
    """
    decision = run.state.decision
    if decision is None or not has_resumable(run):
        return None
    body = store.saved(run.id, "resumable")
    if body is None:
        return None
    try:
        saved = ResumableState.model_validate(json.loads(body))
    except (ValueError, ValidationError):
        raise CorruptResumableState(f"the resumable state of run {run.id} is unreadable") from None
    if saved.kind is not decision.kind or state_digest(saved) != decision.digest:
        raise CorruptResumableState(
            f"the resumable state of run {run.id} does not match the digest its decision "
            "was bound to"
        )
    return saved.model_dump(mode="json")


def decode_request(body: bytes) -> dict[str, Any]:
    """The request a run was queued with (an empty one if none was saved)."""
    if not body:
        return {}
    value = json.loads(body)
    return value if isinstance(value, dict) else {"input": value}


def _not_awaitable(result: Any, agent: str) -> Any:
    if inspect.isawaitable(result):
        discard_awaitable(result)
        raise AwaitableAgent(agent)
    return result


class LoopAlreadyRunning(RuntimeError):
    """An async agent was to be run to its end from a thread whose event loop is running."""


def run_to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` on a fresh event loop in this thread (the synchronous API's way to
    run an async agent: `Runtime.start`, a resume `here`).

    Raises:
        LoopAlreadyRunning: this thread already runs a loop (nothing ran); use
            `steptrail.open_async` and await instead.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    coroutine.close()
    raise LoopAlreadyRunning(
        "an async agent cannot be run to its end from inside a running event loop; "
        "use `async with steptrail.open_async(app)` and await it"
    )
