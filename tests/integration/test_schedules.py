"""Schedules on both backends (ADR 0076): definitions reconciled with the store, one run
per tick however many schedulers fire it, a crash between the enqueue and the move repeats
nothing, missed ticks follow the policy, operators pause, resume and trigger."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from steptrail import App, RunContext
from steptrail.domain.errors import InvalidActor
from steptrail.domain.schedules import UnknownSchedule, tick_key
from steptrail.runtime import Runtime
from tests.conftest import make_runtime


def digest_app(cron: str = "* * * * * *", **options: Any) -> App:
    app = App()

    @app.agent("digest")
    def digest(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {"team": request.get("team")}

    app.schedule(cron, "digest", request={"team": "ops"}, name="digest", **options)
    return app


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    runtime = make_runtime(db_url, app=digest_app())
    yield runtime
    runtime.close()


def scheduled_runs(rt: Runtime) -> list[Any]:
    return list(rt.runs(agent="digest", limit=1000))


def backdate(rt: Runtime, seconds: float) -> None:
    """Move the schedule's next tick `seconds` into the past, as if nothing had fired it."""
    store: Any = rt.store
    if store.backend == "sqlite":
        with store._write() as (cur, _):
            cur.execute(
                "UPDATE steptrail_schedules SET next_tick_at = next_tick_at - :d",
                {"d": int(seconds * 1_000_000)},
            )
        return
    with store._connection() as conn:
        conn.execute(
            "UPDATE steptrail_schedules SET next_tick_at = next_tick_at - %(d)s",
            {"d": timedelta(seconds=seconds)},
        )


def test_reconcile__stores_the_code_s_schedules_and_keeps_what_operators_did(
    rt: Runtime, db_url: str
) -> None:
    scheduler = rt.scheduler()
    [row] = scheduler.reconcile()
    assert (row.name, row.schedule.cron, row.paused) == ("digest", "* * * * * *", False)
    assert rt.schedules() == [row]
    assert scheduler.reconcile() == [row]  # the same definition changes nothing
    rt.pause_schedule("digest", by="alice")
    changed = make_runtime(db_url, app=digest_app("0 7 * * *"))
    try:
        [again] = changed.scheduler().reconcile()
        assert again.schedule.cron == "0 7 * * *"
        assert again.paused  # the operator paused it; a deploy does not undo that
        assert (again.next_tick_at.hour, again.next_tick_at.minute) == (7, 0)
    finally:
        changed.close()


def test_tick__one_run_per_tick_recorded_as_the_schedule_s(rt: Runtime) -> None:
    scheduler = rt.scheduler()
    scheduler.reconcile()
    backdate(rt, 3)  # ticks 3, 2 and 1 s ago, and now's, are due
    report = scheduler.tick_once()
    assert report.enqueued >= 3
    assert scheduler.tick_once().enqueued <= 1  # at most the tick that came meanwhile
    runs = scheduled_runs(rt)
    keys = [r.state.idempotency_key for r in runs]
    assert len(keys) == len(set(keys)) == report.enqueued + (len(runs) - report.enqueued)
    assert all(k is not None and k.startswith("schedule:digest:") for k in keys)
    first = rt.history(runs[-1].run_id)[0].event
    assert first.actor == "schedule:digest"
    [row] = rt.schedules()
    assert row.last_run_id in {r.run_id for r in runs}


def test_tick__three_schedulers_at_once_make_one_run_per_tick(db_url: str) -> None:
    """Three runtimes' schedulers fire an every-second schedule for 4 s: every tick between
    the first and the last is one run, none twice, none missing."""
    runtimes = [make_runtime(db_url, app=digest_app()) for _ in range(3)]
    stop = threading.Event()
    threads = [
        threading.Thread(target=r.scheduler().run_forever, args=(0.05, stop)) for r in runtimes
    ]
    try:
        for t in threads:
            t.start()
        time.sleep(4)
        stop.set()
        for t in threads:
            t.join(timeout=10)
        keys = sorted(r.state.idempotency_key or "" for r in scheduled_runs(runtimes[0]))
        assert len(keys) >= 3
        assert len(keys) == len(set(keys))
        ticks = [k.removeprefix("schedule:digest:") for k in keys]
        from datetime import datetime

        seconds = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in ticks]
        gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(seconds)}
        assert gaps == {1.0}, ticks
    finally:
        stop.set()
        for r in runtimes:
            r.close()


def test_tick__a_crash_between_enqueue_and_move_repeats_nothing(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = rt.scheduler()
    scheduler.reconcile()
    backdate(rt, 2)

    def dies(*args: Any, **kwargs: Any) -> bool:
        raise SystemExit("killed between the enqueue and the move")

    with monkeypatch.context() as patch:
        patch.setattr(rt.store, "advance_schedule", dies)
        with pytest.raises(SystemExit):
            scheduler.tick_once()
    made = len(scheduled_runs(rt))
    assert made >= 2
    again = rt.scheduler().tick_once()  # "another process": the same ticks are due
    assert again.existing == made
    assert len(scheduled_runs(rt)) == made + again.enqueued


@pytest.mark.parametrize(("policy", "from_missed"), [("skip", 0), ("latest", 1)])
def test_missed__ticks_older_than_the_grace_follow_the_policy(
    db_url: str, policy: str, from_missed: int
) -> None:
    rt = make_runtime(db_url, app=digest_app(missed=policy, grace_seconds=2))
    try:
        scheduler = rt.scheduler()
        scheduler.reconcile()
        backdate(rt, 3600)  # an hour of ticks nobody fired
        report = scheduler.tick_once()
        assert report.missed == 1
        runs = scheduled_runs(rt)
        # Within the 2 s grace: the ticks of the last 2-3 seconds; beyond it, by policy.
        assert 2 + from_missed <= len(runs) <= 4 + from_missed
    finally:
        rt.close()


def test_operators__pause_resume_trigger_and_refusals(rt: Runtime) -> None:
    scheduler = rt.scheduler()
    scheduler.reconcile()
    assert rt.pause_schedule("digest", by="alice").paused
    backdate(rt, 1)
    assert scheduler.tick_once().enqueued == 0  # paused: nothing fires
    run_id = rt.trigger_schedule("digest", by="bob")  # a run now, outside the ticks
    assert rt.get(run_id).state.idempotency_key is None
    assert rt.history(run_id)[0].event.actor == "bob"
    resumed = rt.resume_schedule("digest", by="alice")
    assert not resumed.paused
    assert resumed.updated_by == "alice"
    assert scheduler.tick_once().enqueued >= 1
    with pytest.raises(UnknownSchedule, match="nightly"):
        rt.pause_schedule("nightly", by="alice")
    with pytest.raises(InvalidActor):
        rt.trigger_schedule("digest", by="")


def test_tick__a_schedule_of_an_agent_this_app_lacks_is_left_alone(db_url: str) -> None:
    owner = make_runtime(db_url, app=digest_app())
    other = make_runtime(db_url)  # the built-in agents only
    try:
        owner.scheduler().reconcile()
        backdate(owner, 2)
        assert other.scheduler().tick_once().enqueued == 0
        assert owner.scheduler().tick_once().enqueued >= 2
        assert tick_key("digest", owner.schedules()[0].last_tick_at) in {  # type: ignore[arg-type]
            r.state.idempotency_key for r in scheduled_runs(owner)
        }
    finally:
        owner.close()
        other.close()


def test_kit__fire_schedules_after_skipping_time(sqlite_url: str) -> None:
    """The testing kit fires what skipped time made due (SQLite skips time; a PostgreSQL
    database the kit created does too)."""
    from steptrail.testing import Kit

    rt = make_runtime(sqlite_url, app=digest_app("* * * * *", grace_seconds=120))
    try:
        kit = Kit(rt)
        assert kit.fire_schedules().enqueued == 0  # stored; its first tick is ahead
        kit.skip(61)
        assert kit.fire_schedules().enqueued == 1
        kit.skip(3600)  # an hour nobody fired: skipped but for the ticks within the grace
        report = kit.fire_schedules()
        assert report.missed == 1
        assert report.enqueued in {1, 2}
        rt.work(burst=True)
        assert {r.status.value for r in scheduled_runs(rt)} == {"completed"}
    finally:
        rt.close()


def test_check__a_request_the_agent_refuses_stops_the_scheduler_before_it_fires(
    db_url: str,
) -> None:
    from pydantic import BaseModel

    from steptrail.domain.schedules import InvalidSchedule

    class Team(BaseModel):
        team: str

    app = App()

    @app.agent("digest", request_model=Team)
    def digest(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {}

    app.schedule("0 7 * * *", "digest", request={"tem": "ops"})
    app.schedule("0 7 * * *", "missing", name="orphan")
    rt = make_runtime(db_url, app=app)
    try:
        with pytest.raises(InvalidSchedule, match=r"'digest'.*team"):
            rt.scheduler()
        assert rt.schedules() == []  # nothing stored, nothing fired
    finally:
        rt.close()
