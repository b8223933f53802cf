"""The run events, as a public API: match on them in your projections.

Every event is a frozen pydantic model nested on `Run` and re-exported here under its short
name (`steptrail.events.StepRecorded` is `Run.StepRecorded`). Each class has:

* `TOPIC` — the name stored in the log (`"steptrail.Run.StepRecorded"`). A topic is never
  renamed or reused, so a projection may match on it forever (`TOPICS` maps topic → class).
* `VERSION` — the shape of its payload. When a payload changes, the class's `VERSION` goes
  up and it gains an `upcast(data, from_version)`; stored payloads of older versions are
  upcast when they are read, so a projection (like every reader of the log) only ever sees
  the current class. Adding an optional field with a default needs no new version.

Events carry no instants and no run id (except the creation events); a projection gets both
from its `EventContext` (`ctx.run_id`, `ctx.version`, `ctx.recorded_at`, `ctx.position`).

    from steptrail import events

    def apply(event: events.RunEvent, ctx: steptrail.EventContext) -> None:
        match event:
            case events.Queued(agent=agent): ...
            case events.StepRecorded(tokens=tokens, cost=cost): ...
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from steptrail.domain.queues import PriorityChanged
from steptrail.domain.run import EVENT_TYPES, Run, RunEvent
from steptrail.domain.waits import WaitStarted, Woken

Queued = Run.Queued
Started = Run.Started
Claimed = Run.Claimed
StepRecorded = Run.StepRecorded
LeaseRenewed = Run.LeaseRenewed
EffectPending = Run.EffectPending
Completed = Run.Completed
Failed = Run.Failed
Cancelled = Run.Cancelled
Requeued = Run.Requeued
Reclaimed = Run.Reclaimed
DeadLettered = Run.DeadLettered
Suspended = Run.Suspended
Decided = Run.Decided
Resumed = Run.Resumed
Released = Run.Released
Replayed = Run.Replayed
Retried = Run.Retried

TOPICS: Mapping[str, type[RunEvent]] = MappingProxyType(EVENT_TYPES)
"""Every event class by its stored topic (read-only)."""


def topic_of(event: RunEvent | type[RunEvent]) -> str:
    """The stored topic of an event or event class."""
    return event.TOPIC


__all__ = [
    "TOPICS",
    "Cancelled",
    "Claimed",
    "Completed",
    "DeadLettered",
    "Decided",
    "EffectPending",
    "Failed",
    "LeaseRenewed",
    "PriorityChanged",
    "Queued",
    "Reclaimed",
    "Released",
    "Replayed",
    "Requeued",
    "Resumed",
    "Retried",
    "RunEvent",
    "Started",
    "StepRecorded",
    "Suspended",
    "WaitStarted",
    "Woken",
    "topic_of",
]
