"""Named queues and priorities (ADR 0077, on ADR 0068 section 3).

Every run belongs to one queue, named when it is enqueued and never changed, and has a
priority, which an operator may change while the run waits to be claimed. The claim walks a
worker's queues and takes the highest priority first, then the run that became claimable
first. Both are columns of the run index (the claim index leads with them), folded from the
run's `Queued` event and, for the priority, from `PriorityChanged`.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from steptrail.domain.enums import RunStatus
from steptrail.domain.errors import IllegalTransition
from steptrail.domain.run_state import RunEvent, RunState

# The queue a run goes to when nobody names one.
DEFAULT_QUEUE = "default"
# Priorities are integers in [MIN_PRIORITY, MAX_PRIORITY]; higher is claimed first.
DEFAULT_PRIORITY = 0
MIN_PRIORITY = -100
MAX_PRIORITY = 100

# A queue's name: lower-case letters, digits, '_', '.', '-', starting with a letter or a
# digit, at most 63 characters. Safe in a command line, a log line, a metric label and a
# URL without quoting.
QUEUE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")

# The statuses whose priority may change: the run is not held by anybody, and will be
# claimed again (queued now, or waiting to be woken).
CHANGEABLE = "queued or waiting"


def check_queue(name: Any) -> str:
    """`name` if it can name a queue; ValueError saying what a name is otherwise."""
    if not isinstance(name, str) or QUEUE_NAME.fullmatch(name) is None:
        raise ValueError(
            f"invalid queue name {name!r}: 1 to 63 of a-z, 0-9, '_', '.', '-', "
            "starting with a letter or a digit"
        )
    return name


def check_priority(priority: Any) -> int:
    """`priority` if it is an integer in range; ValueError otherwise (a bool is no integer)."""
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise ValueError(
            f"invalid priority {priority!r}: an integer from {MIN_PRIORITY} to {MAX_PRIORITY}"
        )
    return priority


class PriorityChanged(RunEvent):
    """An operator changed the priority of a run that was not held: the claim orders it by
    `priority` from now on. `previous` is what it had."""

    TOPIC: ClassVar[str] = "steptrail.Run.PriorityChanged"
    priority: int
    previous: int = DEFAULT_PRIORITY

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return s.evolve(priority=self.priority)


def can_change_priority(state: RunState) -> bool:
    return state.status is RunStatus.QUEUED or state.status.is_waiting


def change_priority(run: Any, *, priority: int, actor: str) -> bool:
    """Record `run`'s new priority; False (nothing recorded) when it has it already.

    Raises:
        ValueError: the priority is out of range.
        IllegalTransition: the run is running or settled.
    """
    check_priority(priority)
    if not can_change_priority(run.state):
        raise IllegalTransition(
            f"cannot change the priority of a run that is {run.state.status} "
            f"(only of one {CHANGEABLE})"
        )
    if run.state.priority == priority:
        return False
    run.trigger(PriorityChanged(actor=actor, priority=priority, previous=run.state.priority))
    return True


def priority_changed(run: Any) -> bool:
    """Whether `run`'s pending events change its priority (its store writes the column)."""
    return any(type(e) is PriorityChanged for e in run.pending_events)
