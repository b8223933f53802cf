"""The runtime's schedules (ADR 0076): a base of `Runtime`, as `runtime_views` is.

Schedules are defined in code (`App.schedule`) and kept in the store, where the scheduler
of every worker fires their ticks and operators pause, resume and trigger them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from steptrail.domain.actors import check_actor
from steptrail.domain.schedules import ScheduleRow, UnknownSchedule

if TYPE_CHECKING:
    import structlog

    from steptrail.infrastructure.postgres import PostgresRunStore
    from steptrail.infrastructure.settings import Settings
    from steptrail.infrastructure.sqlite import SQLiteRunStore
    from steptrail.workers.registry import App
    from steptrail.workers.scheduler import Scheduler


class RuntimeSchedules:
    """What `Runtime` does with schedules."""

    app: App
    settings: Settings
    store: PostgresRunStore | SQLiteRunStore
    log: structlog.typing.FilteringBoundLogger

    if TYPE_CHECKING:  # Runtime's own, used here

        def enqueue_once(
            self,
            agent: str,
            request: Mapping[str, Any] | None = None,
            *,
            idempotency_key: str | None = None,
            actor: str = "enqueue",
        ) -> tuple[UUID, bool]: ...

    def scheduler(self) -> Scheduler:
        """The scheduler of this runtime's schedules: `run_forever(poll, stop)` stores the
        app's definitions and fires due ticks until stopped; `tick_once()` is one pass."""
        from steptrail.workers.scheduler import Scheduler

        return Scheduler(
            self.store,
            self.app.schedules,
            self.app.agent_names,
            self.enqueue_once,
            log=self.log,
        )

    def schedules(self) -> list[ScheduleRow]:
        """Every schedule the store keeps (those the app defines once a worker, or
        `scheduler().reconcile()`, has stored them), by name."""
        return self.store.schedule_rows()

    def schedule_row(self, name: str) -> ScheduleRow:
        """One stored schedule.

        Raises:
            UnknownSchedule: the store keeps no schedule of that name.
        """
        for row in self.store.schedule_rows():
            if row.name == name:
                return row
        defined = " (the app defines it: a worker stores it when it starts)"
        raise UnknownSchedule(
            f"no schedule {name!r}" + (defined if name in self.app.schedules else "")
        )

    def pause_schedule(self, name: str, *, by: str) -> ScheduleRow:
        """Stop firing `name` until resumed; ticks meanwhile are missed (see its policy)."""
        check_actor(by)
        self.schedule_row(name)
        row = self.store.pause_schedule(name, paused=True, by=by)
        self.log.info("schedule_paused", schedule=name, by=by)
        return row

    def resume_schedule(self, name: str, *, by: str) -> ScheduleRow:
        """Fire `name` again: ticks older than its grace are handled by its policy."""
        check_actor(by)
        self.schedule_row(name)
        row = self.store.pause_schedule(name, paused=False, by=by)
        self.log.info("schedule_resumed", schedule=name, by=by)
        return row

    def trigger_schedule(self, name: str, *, by: str) -> UUID:
        """Enqueue one run of `name` now, outside its ticks, recorded as enqueued by `by`
        (a paused schedule can be triggered; its ticks are not changed)."""
        check_actor(by)
        schedule = self.schedule_row(name).schedule
        run_id, _ = self.enqueue_once(schedule.agent, dict(schedule.request), actor=by)
        self.log.info("schedule_triggered", schedule=name, by=by, run_id=str(run_id))
        return run_id
