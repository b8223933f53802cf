"""An operator changes a waiting run's priority (ADR 0077): a fenced append of
`PriorityChanged`, retried on the newer state when the run moved meanwhile (a wake-up, a
claim that took it: then the run is running and the change is refused)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from steptrail.domain.actors import check_actor
from steptrail.domain.errors import IllegalTransition, UnknownRun, VersionConflict
from steptrail.domain.ports import RunStore
from steptrail.domain.queues import change_priority, check_priority

# Appends tried before giving up on a run that keeps changing (as `cancel` does).
ATTEMPTS = 5


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
