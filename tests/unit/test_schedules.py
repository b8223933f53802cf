"""Which ticks a schedule fires (ADR 0076): on-time ticks each once, missed ones by policy,
names, cron expressions and policies checked before anything is kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steptrail import App
from steptrail.domain.schedules import (
    MOST_TICKS_PER_PASS,
    InvalidSchedule,
    Missed,
    Schedule,
    due,
    next_tick,
    tick_key,
)

T0 = datetime(2026, 12, 7, 7, 0, 0, tzinfo=UTC)


def every_minute(missed: Missed = Missed.SKIP, grace: float = 60.0) -> Schedule:
    return Schedule(name="digest", cron="* * * * *", agent="digest", missed=missed, grace_s=grace)


def test_due__nothing_before_the_next_tick() -> None:
    firing = due(every_minute(), T0, T0 - timedelta(seconds=1))
    assert firing.ticks == ()
    assert firing.next_tick == T0
    assert firing.missed is None


def test_due__on_time_ticks_fire_each_once() -> None:
    firing = due(every_minute(), T0, T0 + timedelta(seconds=59))
    assert firing.ticks == (T0,)
    assert firing.next_tick == T0 + timedelta(minutes=1)
    # Ticks within the grace all fire, in order (a scheduler away for 50 s, every second).
    seconds = Schedule(name="s", cron="* * * * * *", agent="a", grace_s=60)
    firing = due(seconds, T0, T0 + timedelta(seconds=50))
    assert firing.ticks == tuple(T0 + timedelta(seconds=i) for i in range(51))
    assert firing.missed is None


def test_due__missed_ticks_are_skipped_or_the_latest_runs_once() -> None:
    now = T0 + timedelta(hours=3, seconds=30)
    skip = due(every_minute(Missed.SKIP), T0, now)
    assert skip.ticks == (now.replace(second=0),)  # the on-time one (30 s old) only
    assert skip.missed == (T0, now.replace(second=0) - timedelta(minutes=1))
    latest = due(every_minute(Missed.LATEST), T0, now)
    assert latest.ticks == (now.replace(second=0) - timedelta(minutes=1), now.replace(second=0))
    assert latest.next_tick == now.replace(second=0) + timedelta(minutes=1)


def test_due__a_year_idle_is_not_walked_tick_by_tick() -> None:
    seconds = Schedule(name="s", cron="* * * * * *", agent="a", grace_s=1, missed=Missed.LATEST)
    now = T0 + timedelta(days=365)
    firing = due(seconds, T0, now)
    assert firing.ticks[0] == now - timedelta(seconds=2)
    assert firing.ticks[-1] == now
    assert len(firing.ticks) == 3


def test_due__at_most_a_bounded_number_per_pass_the_rest_next_pass() -> None:
    seconds = Schedule(name="s", cron="* * * * * *", agent="a", grace_s=3600)
    now = T0 + timedelta(seconds=500)
    first = due(seconds, T0, now)
    assert len(first.ticks) == MOST_TICKS_PER_PASS
    second = due(seconds, first.next_tick, now)
    assert second.ticks[0] == first.ticks[-1] + timedelta(seconds=1)


@settings(deadline=None, max_examples=60)
@given(
    minutes=st.integers(min_value=0, max_value=600),
    grace=st.integers(min_value=1, max_value=7200),
    policy=st.sampled_from(list(Missed)),
)
def test_due__passes_never_fire_a_tick_twice_nor_skip_an_on_time_one(
    minutes: int, grace: int, policy: Missed
) -> None:
    schedule = every_minute(policy, float(grace))
    now = T0 + timedelta(minutes=minutes, seconds=17)
    fired: list[datetime] = []
    next_at = T0
    for _ in range(20):
        firing = due(schedule, next_at, now)
        fired += firing.ticks
        next_at = firing.next_tick
    assert len(fired) == len(set(fired))
    assert fired == sorted(fired)
    assert next_at > now
    on_time = [t for t in _ticks(T0, now) if t >= now - timedelta(seconds=grace)]
    assert set(on_time) <= set(fired)
    missed = [t for t in _ticks(T0, now) if t < now - timedelta(seconds=grace)]
    expected_missed = 0 if policy is Missed.SKIP or not missed else 1
    assert len(set(fired) & set(missed)) == expected_missed


def _ticks(start: datetime, end: datetime) -> list[datetime]:
    ticks, t = [start], start
    while (t := next_tick("* * * * *", t)) <= end:
        ticks.append(t)
    return ticks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "not a cron expression"),
        ({"cron": "* * * *"}, "not a cron expression"),
        ({"cron": " "}, "needs a cron expression"),
        ({"name": "bad name!"}, "schedule name"),
        ({"missed": "all"}, "missed ticks"),
        ({"grace_s": 0}, "grace"),
        ({"agent": ""}, "agent"),
    ],
)
def test_schedule__bad_definitions_are_refused(kwargs: dict, message: str) -> None:
    fields = {"name": "ok", "cron": "0 7 * * *", "agent": "digest", **kwargs}
    with pytest.raises(InvalidSchedule, match=message):
        Schedule(**fields)


def test_app_schedule__names_keys_and_clashes() -> None:
    app = App()
    made = app.schedule("0 7 * * *", "digest", request={"team": "ops"})
    assert made.name == "digest@0_7_*_*_*"
    assert app.schedules == {made.name: made}
    assert app.schedule("0 7 * * *", "digest", request={"team": "ops"}) == made  # same again
    with pytest.raises(ValueError, match="already defined"):
        app.schedule("0 8 * * *", "digest", name=made.name)
    assert tick_key("digest", T0) == "schedule:digest:2026-12-07T07:00:00Z"
    other = App()
    other.schedule("0 8 * * *", "digest", name=made.name)
    with pytest.raises(ValueError, match="already defined"):
        app.include(other)
