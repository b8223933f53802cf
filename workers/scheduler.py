"""The scheduler (ADR 0076): fires the schedules' due ticks as runs, exactly once each.

Every worker may run one (`steptrail work` does, unless `--no-schedules`). A pass reads the
schedules whose next tick is due by the store's clock, enqueues one run per due tick with
the tick's idempotency key (`schedule:<name>:<tick>`), then moves the schedule on with a
compare-and-set on its next tick. Two schedulers firing the same tick make one run (the
key); a scheduler that dies between the enqueue and the move leaves the tick due, and the
next pass (its own or another's) finds the run by its key and moves on. Nothing is held
between passes: no lease, no lock, no leader.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

import structlog

from steptrail.domain.schedules import (
    Schedule,
    ScheduleRow,
    due,
    schedule_actor,
    tick_key,
)

DUE_PER_PASS = 100  # schedules read per pass; a pass with more due goes on at once

# Runtime.enqueue_once(agent, request, idempotency_key=, actor=) -> (run id, whether it is new)
Enqueue = Callable[..., tuple[UUID, bool]]


class ScheduleStore(Protocol):
    def define_schedule(self, schedule: Schedule, *, by: str) -> ScheduleRow: ...

    def due_schedules(self, limit: int) -> tuple[datetime, list[ScheduleRow]]: ...

    def advance_schedule(
        self,
        name: str,
        *,
        expected: datetime,
        next_tick_at: datetime,
        last_tick_at: datetime | None,
        last_run_id: UUID | None,
    ) -> bool: ...


@dataclass
class PassReport:
    """What one pass did: runs enqueued (new), ticks whose run existed already, ticks
    missed and dropped by policy, schedules another scheduler had moved on first."""

    enqueued: int = 0
    existing: int = 0
    missed: int = 0
    lost_races: int = 0
    failed: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "enqueued": self.enqueued,
            "existing": self.existing,
            "missed": self.missed,
            "lost_races": self.lost_races,
            "failed": dict(self.failed),
        }


class Scheduler:
    """Fires the due ticks of the schedules whose agent `agents` holds."""

    def __init__(
        self,
        store: ScheduleStore,
        schedules: Mapping[str, Schedule],
        agents: list[str],
        enqueue: Enqueue,
        *,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.store = store
        self.schedules = dict(schedules)
        self.agents = set(agents)
        self.enqueue = enqueue
        self.log = log

    def reconcile(self, *, by: str = "code") -> list[ScheduleRow]:
        """Store every schedule the code defines (new ones start at their next tick after
        now; a changed cron restarts from now; a paused one stays paused)."""
        return [self.store.define_schedule(s, by=by) for s in self.schedules.values()]

    def tick_once(self) -> PassReport:
        """One pass over the due schedules (see the module docstring)."""
        report = PassReport()
        now, rows = self.store.due_schedules(DUE_PER_PASS)
        for row in rows:
            if row.schedule.agent not in self.agents:
                continue  # another deployment's agent: its own schedulers fire it
            try:
                self._fire(row, now, report)
            except Exception as error:  # noqa: BLE001 - one schedule's failure stops no other
                report.failed[row.name] = f"{type(error).__name__}: {error}"
                self.log.warning("schedule_failed", schedule=row.name, error=str(error))
        return report

    def _fire(self, row: ScheduleRow, now: datetime, report: PassReport) -> None:
        firing = due(row.schedule, row.next_tick_at, now)
        if firing.missed is not None:
            first, last = firing.missed
            report.missed += 1
            self.log.warning(
                "schedule_missed",
                schedule=row.name,
                first=first.isoformat(),
                last=last.isoformat(),
                policy=row.schedule.missed.value,
            )
        last_run: UUID | None = None
        for tick in firing.ticks:
            key = tick_key(row.name, tick)
            last_run, created = self.enqueue(
                row.schedule.agent,
                dict(row.schedule.request),
                idempotency_key=key,
                actor=schedule_actor(row.name),
            )
            if created:
                report.enqueued += 1
                self.log.info(
                    "schedule_fired", schedule=row.name, tick=tick.isoformat(), run_id=str(last_run)
                )
            else:
                report.existing += 1
        moved = self.store.advance_schedule(
            row.name,
            expected=row.next_tick_at,
            next_tick_at=firing.next_tick,
            last_tick_at=firing.ticks[-1] if firing.ticks else None,
            last_run_id=last_run,
        )
        if not moved:
            report.lost_races += 1

    def run_forever(self, poll: float, stop: threading.Event) -> None:
        """Reconcile, then a pass every `poll` seconds until `stop` is set; a store outage
        is logged and the next pass tries again."""
        from steptrail.domain.errors import StoreUnavailable

        while not stop.is_set():
            try:
                self.reconcile()
                break
            except StoreUnavailable as error:
                self.log.warning("schedules_unavailable", error=str(error))
                stop.wait(poll)
        while not stop.is_set():
            try:
                report = self.tick_once()
            except StoreUnavailable as error:
                self.log.warning("schedules_unavailable", error=str(error))
                stop.wait(poll)
                continue
            if report.enqueued or report.existing:
                continue  # there may be more due: go on at once
            stop.wait(poll)
