"""Schedules (ADR 0076): a cron expression that enqueues a run of an agent at every tick.

Pure: which ticks are due at an instant, under which policy for the ones nobody fired in
time, and the idempotency key of each tick. The store keeps each schedule's next tick; the
scheduler (workers/scheduler.py) fires what is due; the key makes every tick one run,
however many schedulers fire it.

Ticks are computed in UTC, from cron expressions of 5 fields (minute, hour, day of month,
month, day of week) or 6 (a leading seconds field), parsed by cronsim.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID

from cronsim import CronSim, CronSimError

from steptrail.domain.errors import DomainError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@*/,-]{0,127}")
DEFAULT_GRACE_S = 60.0
MOST_TICKS_PER_PASS = 100  # on-time ticks fired for one schedule in one pass; the rest next pass


class InvalidSchedule(DomainError, ValueError):
    """A schedule cannot be defined as given (name, cron expression, policy); nothing written."""


class UnknownSchedule(DomainError, LookupError):
    """No schedule has that name."""


class Missed(StrEnum):
    """What happens to ticks older than the grace period (nobody fired them in time)."""

    SKIP = "skip"  # none of them runs; the schedule goes on from the next tick
    LATEST = "latest"  # the latest of them runs, once; the others are skipped


@dataclass(frozen=True)
class Schedule:
    """A schedule as code defines it (`App.schedule`) and the store keeps it."""

    name: str
    cron: str
    agent: str
    request: Mapping[str, Any] = field(default_factory=dict)
    missed: Missed = Missed.SKIP
    grace_s: float = DEFAULT_GRACE_S

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise InvalidSchedule(
                f"a schedule name is 1-128 letters, digits and _ . : @ * / , -, not {self.name!r}"
            )
        check_cron(self.cron)
        if not isinstance(self.agent, str) or not self.agent:
            raise InvalidSchedule("a schedule needs the name of the agent it runs")
        object.__setattr__(self, "missed", _missed(self.missed))
        if not isinstance(self.grace_s, int | float) or not 0 < self.grace_s <= 86_400:
            raise InvalidSchedule("a schedule's grace is more than 0 and at most 86,400 seconds")
        if not isinstance(self.request, Mapping):
            raise InvalidSchedule("a schedule's request is a JSON object")

    @property
    def request_json(self) -> str:
        return json.dumps(dict(self.request), sort_keys=True, separators=(",", ":"))

    def first_tick(self, now: datetime) -> datetime:
        """The first tick after `now` (a new schedule fires nothing from its past)."""
        return next_tick(self.cron, now)


def _missed(value: Missed | str) -> Missed:
    try:
        return Missed(value)
    except ValueError:
        allowed = ", ".join(m.value for m in Missed)
        raise InvalidSchedule(
            f"missed ticks are handled by one of {allowed}, not {value!r}"
        ) from None


def check_cron(cron: str) -> None:
    """Raise InvalidSchedule unless `cron` is a 5- or 6-field cron expression."""
    if not isinstance(cron, str) or not cron.strip():
        raise InvalidSchedule("a schedule needs a cron expression, e.g. '0 7 * * *'")
    try:
        CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as error:
        raise InvalidSchedule(f"{cron!r} is not a cron expression: {error}") from None


def next_tick(cron: str, after: datetime) -> datetime:
    """The first tick of `cron` strictly after `after` (UTC, whole seconds)."""
    start = after.astimezone(UTC).replace(microsecond=0)
    return next(iter(CronSim(cron, start)))


@dataclass(frozen=True)
class Firing:
    """What one pass does for a schedule: the ticks to enqueue, in order, and the schedule's
    next tick afterwards. `missed` is the first and last tick nobody fired in time (None if
    none was), whether or not the policy ran the last of them."""

    ticks: tuple[datetime, ...]
    next_tick: datetime
    missed: tuple[datetime, datetime] | None = None


def due(schedule: Schedule, next_at: datetime, now: datetime) -> Firing:
    """The ticks of `schedule` due at `now` (the store's clock) when its next unfired tick
    is `next_at`.

    A tick at most `grace_s` old is on time and fires, each one (up to MOST_TICKS_PER_PASS;
    the rest in the next pass). Older ticks were missed (nothing ran the scheduler then):
    with `skip` none of them runs; with `latest` the newest of them runs, once.
    """
    if next_at > now:
        return Firing((), next_at)
    horizon = now - timedelta(seconds=schedule.grace_s)
    fire: list[datetime] = []
    missed: tuple[datetime, datetime] | None = None
    tick = next_at
    if tick < horizon:
        # The newest tick before the horizon, found backwards from it: a schedule idle for
        # a year is not walked tick by tick.
        last = next(iter(CronSim(schedule.cron, horizon.astimezone(UTC), reverse=True)))
        last = max(last, next_at)
        missed = (next_at, last)
        if schedule.missed is Missed.LATEST:
            fire.append(last)
        tick = next_tick(schedule.cron, last)
    while tick <= now and len(fire) < MOST_TICKS_PER_PASS:
        fire.append(tick)
        tick = next_tick(schedule.cron, tick)
    return Firing(tuple(fire), tick, missed)


def tick_key(name: str, tick: datetime) -> str:
    """The idempotency key of `name`'s run at `tick`: one run per tick, whoever fires it."""
    return f"schedule:{name}:{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def schedule_actor(name: str) -> str:
    """Who enqueued a scheduled run, as its trail says."""
    return f"schedule:{name}"


@dataclass(frozen=True)
class ScheduleRow:
    """A schedule as the store keeps it: its definition, whether an operator paused it, the
    next tick nobody fired yet, and the last tick fired with its run."""

    schedule: Schedule
    paused: bool
    next_tick_at: datetime
    last_tick_at: datetime | None = None
    last_run_id: UUID | None = None
    updated_by: str = ""

    @property
    def name(self) -> str:
        return self.schedule.name


def same_definition(row: ScheduleRow, schedule: Schedule) -> bool:
    """Whether the store's row already holds `schedule` as code defines it."""
    kept = row.schedule
    return (
        kept.cron == schedule.cron
        and kept.agent == schedule.agent
        and kept.request_json == schedule.request_json
        and kept.missed is schedule.missed
        and round(kept.grace_s * 1000) == round(schedule.grace_s * 1000)
    )
