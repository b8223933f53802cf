"""The testing kit: run a user's agent to its end in the test process, skip time, inject
faults, decide at suspensions, and look at what happened (ADR 0034).

    kit = Kit(runtime)
    result = kit.run_to_end("book", {"city": "Oslo"}, decide="approve")
    assert result.status is RunStatus.COMPLETED

Time skipping moves the store's clock, not the host's: a retry delay, a lease expiry or a
retention window passes in no wall time, and the reaper and purge see it. On SQLite the
store's clock is Python's, plus an offset only the kit sets; on PostgreSQL it is the
server's `now()`, which the kit can skip only in a database it created (`pgclock`): on any
other, `skip()` raises `TimeSkippingUnsupported` and `run_to_end` waits out delays and leases
in real time instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast
from uuid import UUID

from steptrail.domain.enums import Outcome, RunStatus, WaitKind
from steptrail.domain.journal import JournalEntry
from steptrail.domain.ports import RecordedEvent, RunStore
from steptrail.domain.run import Run
from steptrail.infrastructure.sqlite import SQLiteRunStore
from steptrail.projections.run_index import RunRow
from steptrail.runtime import Runtime
from steptrail.testing import pgclock
from steptrail.testing.faults import Fault, FaultPlan, FusedStore, SimulatedCrash, context_for
from steptrail.workers.decisions import PendingDecision
from steptrail.workers.execute import Executor, SegmentResult, decode_request, resumable_of
from steptrail.workers.holders import holder_name
from steptrail.workers.lease import LeaseKeeper
from steptrail.workers.reaper import ReapReport
from steptrail.workers.retention import PurgeReport
from steptrail.workers.scheduler import PassReport

Decide = (
    Literal["approve", "deny"]
    | Mapping[str, Any]
    | Callable[[PendingDecision], "Literal['approve', 'deny'] | Mapping[str, Any] | None"]
    | None
)


class TimeSkippingUnsupported(RuntimeError):
    """This store's clock cannot be moved (PostgreSQL reads the server's clock)."""


@dataclass(frozen=True)
class RunResult:
    """A run as the kit left it: status, the agent's return value (if it completed in the
    kit), the trail, the journal (kept only while a run is in flight: it is deleted when the
    run settles), each segment's result, and how many segments crashed."""

    run_id: UUID
    row: RunRow
    trail: list[RecordedEvent]
    journal: list[JournalEntry]
    segments: list[SegmentResult] = field(default_factory=list)
    crashes: int = 0

    @property
    def status(self) -> RunStatus:
        return self.row.status

    @property
    def outcome(self) -> Outcome | None:
        """The last segment's outcome (None if no segment ran)."""
        return self.segments[-1].outcome if self.segments else None

    @property
    def result(self) -> Any:
        """What the agent returned, if the last segment completed the run."""
        last = self.segments[-1] if self.segments else None
        return last.result if last is not None and last.outcome is Outcome.COMPLETED else None

    @property
    def events(self) -> list[Any]:
        return [h.event for h in self.trail]

    @property
    def steps(self) -> list[Run.StepRecorded]:
        """Every step record, in order (a step that ran twice is there twice)."""
        return [e for e in self.events if isinstance(e, Run.StepRecorded)]

    def step_names(self) -> list[str]:
        return [s.name for s in self.steps]


class Kit:
    """Drives runs of a runtime in this process; see the module docstring."""

    def __init__(self, runtime: Runtime, *, max_segments: int = 50) -> None:
        self.runtime = runtime
        self.max_segments = max_segments
        self._pg_clock: bool | None = None

    @property
    def store(self) -> RunStore:
        return cast(RunStore, self.runtime.store)

    # -- time ----------------------------------------------------------------------------------

    @property
    def can_skip_time(self) -> bool:
        """SQLite: always. PostgreSQL: in a database the kit created (see pgclock)."""
        store = self.runtime.store
        if isinstance(store, SQLiteRunStore):
            return True
        if self._pg_clock is None:
            self._pg_clock = pgclock.installed(store.url)
        return self._pg_clock

    def skip(self, seconds: float) -> None:
        """Move the store's clock `seconds` forward (never back), without sleeping.

        Raises:
            TimeSkippingUnsupported: a PostgreSQL database the kit did not create.
        """
        if seconds < 0:
            raise ValueError("time only moves forward")
        store = self.runtime.store
        if isinstance(store, SQLiteRunStore):
            store.clock_offset_us += round(seconds * 1_000_000)
            return
        if not self.can_skip_time:
            raise TimeSkippingUnsupported(
                "this PostgreSQL database reads the server's clock: time skipping needs one "
                "created by the testing kit (the steptrail_database_url fixture)"
            )
        pgclock.skip(store.url, seconds)

    def now(self) -> datetime:
        """The store's clock, skipped time included."""
        return cast(datetime, self.runtime.store.store_now())

    def _wait_until(self, instant: datetime | None) -> None:
        if instant is None:
            return
        left = (instant - self.now()).total_seconds()
        if left <= 0:
            return
        if self.can_skip_time:
            self.skip(left + 0.001)
        else:
            time.sleep(left + 0.01)

    # -- runs ----------------------------------------------------------------------------------

    def enqueue(self, agent: str, request: Mapping[str, Any] | None = None, **kw: Any) -> UUID:
        return self.runtime.enqueue(agent, request, **kw)

    def signal(self, run_id: UUID, name: str, payload: Any = None, *, by: str = "test") -> int:
        """Deliver a signal to the run (as `rt.signal`); returns its number in the inbox."""
        return self.runtime.signal(run_id, name, payload, by=by).seq

    def run_to_end(
        self,
        agent: str,
        request: Mapping[str, Any] | None = None,
        *,
        decide: Decide = None,
        faults: Iterable[Fault] = (),
        by: str = "test",
    ) -> RunResult:
        """Queue a run of `agent` and drive it (see `drive`)."""
        return self.drive(self.enqueue(agent, request), decide=decide, faults=faults, by=by)

    def drive(
        self,
        run_id: UUID,
        *,
        decide: Decide = None,
        faults: Iterable[Fault] = (),
        by: str = "test",
        stop_after: int | None = None,
    ) -> RunResult:
        """Execute `run_id` here until it ends, or waits for a person nobody decides for
        (or, with `stop_after`, once that many segments of it ran).

        Retry delays and expired leases are skipped (SQLite) or waited out (PostgreSQL);
        a crashed segment's run is reclaimed by the reaper once its lease expired. At each
        suspension `decide` answers: "approve", "deny", input values, a function of the
        `PendingDecision` returning one of those, or None to stop there (the run stays
        waiting). A run waiting for its child runs drives them first, here, to their end
        (ADR 0075). A run waiting for a signal stops the drive (deliver it with `signal`,
        then drive again) unless its wait has a timeout; a sleep's time and every wait's deadline
        are skipped like a retry delay. Faults fire once each, in whichever segment reaches
        their step.
        """
        plan = FaultPlan(faults, self.store)
        executor = self._executor(plan)
        segments: list[SegmentResult] = []
        crashes = 0
        try:
            for _ in range(self.max_segments):
                row = self.runtime.get(run_id)
                status = row.status
                if status.is_terminal:
                    break
                if status.is_decidable and self._decide(run_id, decide, by):
                    continue
                if status is RunStatus.WAITING_FOR_EVENT and self._follow_children(
                    run_id, decide, by
                ):
                    continue  # a child settled (or moved on) here: look at the parent again
                if status.is_waiting and row.available_at is None:
                    break  # waits for a person or a signal nobody sends here, with no deadline
                # Queued, or waiting with a deadline (a timer, a timeout): the time is skipped
                # (or waited out) and the claim takes it (ADR 0073).
                if status is RunStatus.RUNNING:  # a crashed (or foreign) segment holds it
                    self._wait_until(row.lease_expires_at)
                    self.reap()
                    continue
                self._wait_until(row.available_at)
                try:
                    segment = self._execute_one(executor, run_id)
                except SimulatedCrash:
                    crashes += 1
                    plan.fuse.blown = None  # the next segment is a new process
                    continue
                if segment is not None:
                    segments.append(segment)
                    if stop_after is not None and len(segments) >= stop_after:
                        break
            else:
                raise RuntimeError(f"run {run_id} did not end within {self.max_segments} segments")
        finally:
            executor.keeper.close()
        return self.result(run_id, segments=segments, crashes=crashes)

    def _follow_children(self, run_id: UUID, decide: Decide, by: str) -> bool:
        """Drive the unfinished children of a run that waits for one (ADR 0075), each to its
        end or its own stop; True if any of them moved."""
        moved = False
        for child in self.store.children(run_id):  # type: ignore[attr-defined]
            if child.status.is_terminal:
                continue
            after = self.drive(child.run_id, decide=decide, by=by).row
            moved = moved or after.state.version != child.state.version
        return moved

    def _execute_one(self, executor: Executor, run_id: UUID) -> SegmentResult | None:
        settings = self.runtime.settings
        agent = self.runtime.get(run_id).state.agent
        sent = time.monotonic()  # the lease counts from the claim's sending (ADR 0016)
        claimed = self.store.claim_batch(
            holder=holder_name("testing"), lease_ms=settings.lease_ms, agents=[agent], limit=1
        )
        if not claimed:
            return None
        run = claimed[0].run
        request = decode_request(claimed[0].request)
        resumable = resumable_of(self.store, run)
        result = executor.execute(run, request, resumable=resumable, lease_from=sent)
        return result if run.id == run_id else None

    def _executor(self, plan: FaultPlan) -> Executor:
        store = cast(RunStore, FusedStore(self.store, plan.fuse))
        executor = Executor(
            store,
            self.runtime.app,
            self.runtime.execution_config(),
            keeper=LeaseKeeper(self.runtime.settings.lease_seconds),
            log=self.runtime.log,
        )
        executor.context_class = context_for(plan)
        return executor

    def _decide(self, run_id: UUID, decide: Decide, by: str) -> bool:
        answer = decide(self.runtime.pending(run_id)) if callable(decide) else decide
        if answer is None:
            return False
        pending = self.runtime.pending(run_id)
        if pending.kind is WaitKind.INPUT:
            if not isinstance(answer, Mapping):
                raise ValueError(f"run {run_id} waits for input: decide with a mapping of values")
            self.runtime.submit_input(run_id, answer, by=by, resume="queue")
        elif answer == "approve":
            self.runtime.approve(run_id, by=by, resume="queue")
        elif answer == "deny":
            self.runtime.deny(run_id, by=by, resume="queue")
        else:
            raise ValueError(f"run {run_id} waits for approval: decide 'approve' or 'deny'")
        return True

    def fire_schedules(self) -> PassReport:
        """Store the app's schedules (as a worker does when it starts) and fire the ticks
        due by the store's clock, once: after `skip`, the ticks the skipped time passed
        (those within a schedule's grace; older ones by its `missed` policy). The runs are
        queued; drive them with `run_to_end` or `runtime.work(burst=True)`."""
        scheduler = self.runtime.scheduler()
        scheduler.reconcile()
        return scheduler.tick_once()

    # -- looking and housekeeping ------------------------------------------------------------

    def result(
        self, run_id: UUID, *, segments: list[SegmentResult] | None = None, crashes: int = 0
    ) -> RunResult:
        return RunResult(
            run_id=run_id,
            row=self.runtime.get(run_id),
            trail=self.runtime.history(run_id),
            journal=self.store.journal(run_id),
            segments=segments or [],
            crashes=crashes,
        )

    def reap(self) -> ReapReport:
        """One reaper pass, at the store's (possibly skipped) time."""
        return self.runtime.reap()

    def purge(self, days: int | None = None) -> PurgeReport:
        """One retention purge, at the store's (possibly skipped) time."""
        return self.runtime.purge(days)
