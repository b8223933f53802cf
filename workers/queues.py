"""Queues and priorities on the operator's side (ADR 0077).

An operator changes a waiting run's priority with a fenced append of `PriorityChanged`,
retried on the newer state when the run moved meanwhile (a wake-up, a claim that took it:
then the run is running and the change is refused); a listing of runs is narrowed to a
queue or a lowest priority."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from steptrail.domain.actors import check_actor
from steptrail.domain.errors import IllegalTransition, UnknownRun, VersionConflict
from steptrail.domain.ports import RunStore
from steptrail.domain.queues import change_priority, check_priority

if TYPE_CHECKING:
    from steptrail.projections.run_index import RunRow

# Appends tried before giving up on a run that keeps changing (as `cancel` does).
ATTEMPTS = 5
# Rows read per store page while a listing is narrowed to a queue or a priority.
LIST_PAGE = 200


def set_priority(
    store: RunStore, run_id: UUID, priority: int, *, actor: str, log: Any = None
) -> bool:
    """Record `run_id`'s new priority; False when it had it already (nothing written).

    Raises:
        ValueError: the priority is out of range (nothing written).
        InvalidActor: `actor` is not an acceptable actor name.
        UnknownRun: no such run.
        IllegalTransition: the run is running or settled, or kept changing.
    """
    check_priority(priority)
    check_actor(actor)
    for _ in range(ATTEMPTS):
        run = store.load(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id}")
        previous = run.state.priority
        if not change_priority(run, priority=priority, actor=actor):
            return False
        try:
            store.append(run)
        except VersionConflict:
            continue  # woken or claimed meanwhile: judge the newer state
        if log is not None:
            log.info(
                "run_priority_changed",
                run_id=str(run_id),
                priority=priority,
                previous=previous,
                by=actor,
            )
        return True
    raise IllegalTransition(f"run {run_id} kept changing; the priority did not land")


def list_placed(
    store: Any,
    *,
    queue: str | None,
    min_priority: int | None,
    limit: int,
    before: tuple[datetime, UUID] | None,
    **filters: str | None,
) -> list[RunRow]:
    """`store.list_rows(**filters)` (either backend's store) narrowed to one queue and a
    lowest priority, newest first: the store's pages (each costs what it returns, ADR 0042)
    are read one after another until `limit` rows pass, so a rare queue costs the runs of
    the other filters walked to find its page."""
    found: list[RunRow] = []
    page = max(limit, LIST_PAGE)
    while len(found) < limit:
        rows: list[RunRow] = store.list_rows(limit=page, before=before, **filters)
        found += [
            r
            for r in rows
            if (queue is None or r.state.queue == queue)
            and (min_priority is None or r.state.priority >= min_priority)
        ]
        if len(rows) < page:
            break
        before = (rows[-1].created_at, rows[-1].run_id)
    return found[:limit]
