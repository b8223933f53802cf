"""The worker loop: claim a run, execute it under its lease, settle it; N at a time.

One dispatcher thread claims while a slot is free and hands each claimed run on: a run of a
synchronous agent to a pool of threads, a run of an async agent to the worker's one event
loop as a task. `concurrency` bounds both together. Threads suit agents that block (100
sleeping runs fit in a process); tasks suit agents that await (thousands do), and their
store calls go to a small pool of store threads so the loop never blocks (ADR 0023). An idle
dispatcher sleeps until the store wakes it (LISTEN/NOTIFY on PostgreSQL, in-process on
SQLite), the earliest due time among the runs it may claim comes (a timer, a wait's
deadline, a retry's backoff: nothing notifies those, ADR 0082) or `poll_interval` passes.

A worker of one slot asks each settle to claim its next run in the same transaction (ADR
0058) and runs it at once: in a steady stream of work a run costs one write for its claim and
its settle together, and the dispatcher claims only when a settle found nothing. With more
slots the dispatcher claims for the slots that free up together, in one statement.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog

from steptrail.domain import rate_limits as rate_limit_rules
from steptrail.domain.enums import Outcome, TerminationReason
from steptrail.domain.errors import CorruptResumableState, StoreUnavailable, VersionConflict
from steptrail.domain.idle import PARTIAL_CLAIM_WAIT_S, idle_wait
from steptrail.domain.ports import ClaimedRun, ClaimRequest, RunStore
from steptrail.domain.run import Run
from steptrail.workers.execute import (
    ExecutionConfig,
    Executor,
    SegmentResult,
    decode_request,
    has_resumable,
    resumable_of,
)
from steptrail.workers.holders import holder_name as holder_name  # noqa: PLC0414 - its old home
from steptrail.workers.lease import LeaseKeeper
from steptrail.workers.rate_limits import store_definitions
from steptrail.workers.registry import App
from steptrail.workers.segment import NextClaim
from steptrail.workers.store_threads import DEFAULT_STORE_THREADS, StoreThreads
from steptrail.workers.telemetry import NO_TELEMETRY, Telemetry

MAX_CLAIM_BATCH = 16


@dataclass
class WorkerReport:
    """What a worker did before it stopped."""

    holder: str
    claimed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {"holder": self.holder, "claimed": self.claimed, "outcomes": dict(self.outcomes)}


class Worker:
    """Claims and executes runs until stopped (or, in burst mode, until nothing is left)."""

    def __init__(
        self,
        store: RunStore,
        app: App,
        config: ExecutionConfig,
        *,
        concurrency: int = 1,
        burst: bool = False,
        poll_interval: float = 1.0,
        log: structlog.typing.FilteringBoundLogger | None = None,
        on_result: Callable[[SegmentResult], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        store_threads: int | None = None,
        telemetry: Telemetry = NO_TELEMETRY,
        queues: Sequence[str] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if queues is not None and not queues:
            raise ValueError("a worker serves at least one queue (None: every queue)")
        self.store = store
        self.app = app
        self.config = config
        self.concurrency = concurrency
        self.burst = burst
        self.poll_interval = poll_interval
        self.holder = holder_name("worker")
        self.log = (log or structlog.get_logger()).bind(worker_id=self.holder)
        self.on_result = on_result
        self.telemetry = telemetry
        # The queues whose runs it claims (ADR 0077); None: every queue.
        self.queues = None if queues is None else tuple(dict.fromkeys(queues))
        self.stopping = threading.Event()
        self.report = WorkerReport(holder=self.holder)
        self._in_flight = 0
        self._slot_freed = threading.Condition()
        # Async runs go to `loop` (the caller's, for `AsyncRuntime.work`) or, when none is
        # given, to a loop this worker starts in its own thread at the first async run.
        self._loop = loop
        self._own_loop: threading.Thread | None = None
        self._threads = StoreThreads(store_threads or DEFAULT_STORE_THREADS)
        self._chain: ClaimRequest | None = None  # what a settle claims next (set by `run`)
        # The earliest due time among the runs it may claim, on this host's monotonic clock
        # (None: none), and whether that is still known (see `_idle_wait`, ADR 0082).
        self._due_at: float | None = None
        self._due_known = False
        # The dispatcher is in an idle wait, or reading the due time for one: a segment that
        # leaves its run unsettled from then on wakes it (see `_finished`, ADR 0087).
        self._idle_waiting = False

    def stop(self) -> None:
        """Stop claiming; runs in flight finish (a second signal may kill the process, and
        the reaper then reclaims what it held once the leases expire)."""
        self.stopping.set()
        self._wake()

    def _wake(self) -> None:
        """End the dispatcher's idle wait now (a store that cannot: at its poll)."""
        wake = getattr(self.store, "wake", None)
        if wake is not None:
            wake()

    def run(self) -> WorkerReport:
        store_definitions(self.store, self.app.rate_limits)  # shared by every worker (ADR 0080)
        keeper = LeaseKeeper(self.config.lease_s)
        executor = Executor(
            self.store,
            self.app,
            self.config,
            keeper=keeper,
            log=self.log,
            threads=self._threads,
            telemetry=self.telemetry,
        )
        agents = self.app.agent_names
        lease_ms = round(self.config.lease_s * 1000)
        # Only a worker of one slot chains its claims to its settles (ADR 0058): with more,
        # the dispatcher claims for the slots that free up together in one statement, and
        # a claim per settle would cost the server more than the round trips it saves.
        if self.concurrency == 1:
            self._chain = ClaimRequest(
                holder=self.holder, lease_ms=lease_ms, agents=tuple(agents), queues=self.queues
            )
        self.log.info(
            "worker_started", concurrency=self.concurrency, agents=agents, queues=self.queues
        )
        # The dispatcher and each slot's thread keep a connection of the store's, where it
        # has them (PostgreSQL's pool, ADR 0088): no checkout and return per statement.
        # All of them: the store's connections grow to the slots and the dispatcher (ADR 0090).
        reserve = getattr(self.store, "reserve_connections", None)
        if reserve is not None:
            reserve(self.concurrency + 1)
        pin: Callable[[], bool] = getattr(self.store, "pin_connection", _nothing_pinned)
        pin()
        try:
            self._dispatch(executor, agents, lease_ms, pin)
        finally:
            unpin = getattr(self.store, "unpin_connection", None)
            if unpin is not None:
                unpin()  # the slot threads' too: they ended with the pool
        self._stop_own_loop()
        self._threads.close()
        keeper.close()
        self.log.info("worker_stopped", **self.report.as_dict())
        return self.report

    def _dispatch(
        self, executor: Executor, agents: list[str], lease_ms: int, pin: Callable[[], bool]
    ) -> None:
        """Claim for the free slots and hand the runs on, until stopped (or, in burst mode,
        until nothing is left); then wait for every run in flight."""
        backoff = 0.1
        with ThreadPoolExecutor(
            self.concurrency, thread_name_prefix="steptrail-run", initializer=pin
        ) as pool:
            while not self.stopping.is_set():
                with self._slot_freed:
                    free = self.concurrency - self._in_flight
                    if free == 0:
                        self._slot_freed.wait(0.5)
                        continue
                sent = time.monotonic()  # claimed leases are counted from here (ADR 0016)
                # As many runs as there are free slots, in one round trip (capped, so one
                # process does not hoard a burst that its peers could start sooner).
                limit = min(free, MAX_CLAIM_BATCH)
                try:
                    claimed = self.store.claim_batch(
                        holder=self.holder,
                        lease_ms=lease_ms,
                        agents=agents,
                        limit=limit,
                        queues=self.queues,
                    )
                # A lost connection is a warning; anything else (a schema changed under a
                # running worker, a claimed row that does not decode, a bug) is logged with
                # its traceback. Both are retried after a backoff: the dispatcher going down
                # would take every run in flight with it. Runs a failed claim leased stay
                # leased until the reaper takes them back, and a run that fails every claim
                # is dead-lettered by the reaper's limit.
                except Exception as error:
                    if isinstance(error, StoreUnavailable):
                        self.log.warning("claim_failed", error=str(error)[:200])
                    else:
                        self.log.exception("claim_error")
                    self.stopping.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                backoff = 0.1
                self.telemetry.claimed(claimed, time.monotonic() - sent)
                if not claimed:
                    with self._slot_freed:
                        idle = self._in_flight == 0
                    # Burst: done when nothing is left, not while runs wait for a place under
                    # their key's limit (ADR 0078): the runs holding the places settle soon;
                    # nor while runs sleep on their rate limit and wake within the horizon
                    # (ADR 0083): a run told to wait longer is left to the next worker.
                    if (
                        self.burst
                        and idle
                        and not self.store.held_back(
                            agents=agents,
                            queues=self.queues,
                            rate_horizon_s=rate_limit_rules.BURST_HORIZON_S,
                        )
                    ):
                        break
                    self._wait_idle(agents)
                    continue
                with self._slot_freed:
                    self._in_flight += len(claimed)
                    self.report.claimed += len(claimed)
                for item in claimed:
                    self._start(pool, executor, item, sent)
                if len(claimed) < limit:
                    # It took all it saw due: pause before the next claim (ADR 0089).
                    self.store.wait_for_work(PARTIAL_CLAIM_WAIT_S)
            # Stopping: wait for every run in flight, threads and tasks alike, so a graceful
            # stop finishes them all before the loop and the store threads go away.
            with self._slot_freed:
                while self._in_flight:
                    self._slot_freed.wait(0.5)

    def _wait_idle(self, agents: Sequence[str]) -> None:
        """Wait until the store wakes this worker or `_idle_wait` passes."""
        self._idle_waiting = True
        try:
            if not self.store.wait_for_work(self._idle_wait(agents)):
                self._due_known = False  # not woken: the due time came, or the poll
        finally:
            self._idle_waiting = False

    def _idle_wait(self, agents: Sequence[str]) -> float:
        """How long the idle dispatcher waits (ADR 0082): the poll interval, or until the
        earliest due time (a timer, a wait's deadline, a backoff) among the runs it may
        claim, which nothing notifies. A store error leaves the poll interval: the claim
        that follows reports it.

        The due time is asked of the store again only when it may have moved: at the first
        idle wait, after a wait that ran out (the due time came, or the poll), and after a
        segment of this worker left its run unsettled (asleep, waiting with a deadline,
        requeued with a backoff). Between runs that settle, a worker woken by each enqueue
        goes straight back to its wait: no round trip between a settle and the next
        enqueue's claim (ADR 0082: that read cost enqueue -> start milliseconds). A sleeper
        another process makes is found at the next wait that runs out: within one poll,
        as before."""
        now = time.monotonic()
        if not self._due_known or (self._due_at is not None and self._due_at <= now):
            self._due_known = True  # before the read: a segment ending meanwhile clears it
            try:
                due = self.store.next_due_in(agents=agents, queues=self.queues)
            except Exception as error:  # noqa: BLE001 - the next claim logs and backs off
                self.log.warning("next_due_failed", error=str(error)[:200])
                due = None
            self._due_at = None if due is None else now + due
        return idle_wait(self.poll_interval, None if self._due_at is None else self._due_at - now)

    def _refuse(self, run: Run, error: CorruptResumableState) -> SegmentResult:
        """A resumed run whose saved calls no longer match its decision's digest must not
        act: it is dead-lettered (not retryable: no retry makes the calls approved)."""
        self.log.error(
            "resumable_state_refused", run_id=str(run.id), version=run.version, why=str(error)
        )
        run.dead_letter(
            actor=self.holder,
            reason=TerminationReason.NOT_RETRYABLE,
            cause="resumable_state_mismatch",
        )
        try:
            self.store.append(run)
        except (VersionConflict, StoreUnavailable):
            return SegmentResult(run.id, Outcome.LEASE_LOST, run.status, run.committed_version)
        return SegmentResult(run.id, Outcome.FAILED, run.status, run.version)

    def _start(
        self, pool: ThreadPoolExecutor, executor: Executor, item: ClaimedRun, sent: float
    ) -> None:
        """Hand a claimed run (its slot already counted) to a thread or to the event loop."""
        if self.app.get(item.run.state.agent).is_async:
            asyncio.run_coroutine_threadsafe(
                self._execute_async(executor, item, sent), self._async_loop()
            )
        else:
            pool.submit(self._execute, pool, executor, item, sent)

    def _execute(
        self, pool: ThreadPoolExecutor, executor: Executor, claimed: ClaimedRun, sent: float
    ) -> None:
        """Run `claimed`, then each run its settle claimed next, in this thread and slot."""
        item: ClaimedRun | None = claimed
        handed_on = False  # the slot went with an async run to the event loop
        try:
            while item is not None:
                chain = NextClaim(self._chain, self.stopping) if self._chain is not None else None
                self._execute_one(executor, item, sent, chain)
                if chain is None or not chain.claimed or chain.sent is None:
                    break
                # The settle's claim is the worker's claim: counted, logged and timed alike.
                self.telemetry.claimed(chain.claimed, chain.latency_s)
                with self._slot_freed:
                    self._in_flight += len(chain.claimed) - 1  # the first takes this slot
                    self.report.claimed += len(chain.claimed)
                item, *more = chain.claimed
                sent = chain.sent
                for other in more:  # a store that claimed more than asked: each its own slot
                    self._start(pool, executor, other, sent)
                if self.app.get(item.run.state.agent).is_async:
                    self._start(pool, executor, item, sent)
                    handed_on = True
                    return
        # A bug in the chaining itself (`_execute_one` catches the rest): runs claimed and not
        # started keep their leases until they expire, and the reaper takes them back.
        except Exception:  # noqa: BLE001
            self._crashed(self.log)
        finally:
            if not handed_on:
                self._free_slot()

    def _execute_one(
        self, executor: Executor, claimed: ClaimedRun, sent: float, chain: NextClaim | None
    ) -> None:
        log = self._claimed(claimed)
        run = claimed.run
        try:
            request = _request_of(claimed)
            try:
                resumable = resumable_of(self.store, run)
            except CorruptResumableState as error:
                result = self._refuse(run, error)
            else:
                result = executor.execute(
                    run,
                    request,
                    resumable=resumable,
                    lease_from=sent,
                    next_claim=chain,
                    journal=claimed.journal,
                )
            self._finished(log, result)
        # A bug in steptrail or a callback (logged by `_crashed`); the run's lease will expire.
        except Exception:  # noqa: BLE001
            self._crashed(log)

    async def _execute_async(self, executor: Executor, claimed: ClaimedRun, sent: float) -> None:
        log = self._claimed(claimed)
        run = claimed.run
        try:
            request = _request_of(claimed)
            resumable = None
            try:
                if has_resumable(run):
                    resumable = await self._threads.call(resumable_of, self.store, run)
            except CorruptResumableState as error:
                result = await self._threads.call(self._refuse, run, error)
            else:
                result = await executor.execute_async(
                    run, request, resumable=resumable, lease_from=sent, journal=claimed.journal
                )
            self._finished(log, result)
        except Exception:  # noqa: BLE001 - as in `_execute`
            self._crashed(log)
        finally:
            self._free_slot()

    def _claimed(self, claimed: ClaimedRun) -> structlog.typing.FilteringBoundLogger:
        run = claimed.run
        log = self.log.bind(run_id=str(run.id), version=run.version)
        if run.state.trace_id is not None:
            log = log.bind(trace_id=run.state.trace_id)
        log.info("run_claimed", agent=run.state.agent, attempt=run.state.requeue_count + 1)
        return log

    def _finished(self, log: structlog.typing.FilteringBoundLogger, result: SegmentResult) -> None:
        log.info("segment_finished", outcome=result.outcome.value, version=result.version)
        if not result.status.is_terminal:  # asleep, waiting, requeued: a due time may be new
            self._due_known = False
            # The dispatcher may have read the due time before this commit and be waiting
            # its poll on that answer: woken, it claims (nothing) and reads it again.
            if self._idle_waiting:
                self._wake()
        with self._slot_freed:
            self.report.outcomes[result.outcome.value] += 1
        if self.on_result is not None:
            self.on_result(result)

    def _crashed(self, log: structlog.typing.FilteringBoundLogger) -> None:
        log.exception("segment_crashed")
        self._due_known = False
        with self._slot_freed:
            self.report.outcomes[Outcome.LEASE_LOST.value] += 1

    def _free_slot(self) -> None:
        with self._slot_freed:
            self._in_flight -= 1
            self._slot_freed.notify_all()
        wake = getattr(self.store, "wake", None)
        if wake is not None:
            wake()

    # -- the event loop of async runs ----------------------------------------------------------

    def _async_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._own_loop = threading.Thread(
                target=loop.run_forever, name="steptrail-async-runs", daemon=True
            )
            self._own_loop.start()
            self._loop = loop
        return self._loop

    def _stop_own_loop(self) -> None:
        if self._own_loop is None or self._loop is None:
            return
        loop = self._loop
        loop.call_soon_threadsafe(loop.stop)
        self._own_loop.join(timeout=5)
        if not loop.is_running():
            loop.close()
        self._own_loop, self._loop = None, None


def _nothing_pinned() -> bool:
    return False


def _request_of(claimed: ClaimedRun) -> dict[str, Any]:
    try:
        return decode_request(claimed.request)
    except ValueError:
        return {}
