"""Schedules with real worker processes (ADR 0076): three workers fire an every-second
schedule, all of them are SIGKILLed and two come back after a pause: every tick from the
first to the last is exactly one run, the ones of the pause included (they are within the
grace); and `steptrail schedules` lists, pauses, resumes and triggers."""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.helpers import spawn_worker, steptrail
from tests.acceptance.test_faults import stop, wait_until
from tests.conftest import make_runtime

pytestmark = pytest.mark.slow
APP = {"STEPTRAIL_APP": "tests.acceptance.schedule_app:app"}


def ticks(db_url: str) -> list[datetime]:
    rt = make_runtime(db_url)
    try:
        keys = [r.state.idempotency_key or "" for r in rt.runs(agent="heartbeat", limit=1000)]
    finally:
        rt.close()
    scheduled = [k for k in keys if k.startswith("schedule:every-second:")]
    assert len(scheduled) == len(set(scheduled)), "a tick ran twice"
    return sorted(
        datetime.fromisoformat(k.removeprefix("schedule:every-second:").replace("Z", "+00:00"))
        for k in scheduled
    )


def test_schedule__three_workers_killed_and_restarted_one_run_per_tick(
    db_url: str, tmp_path: Path
) -> None:
    assert steptrail("migrate", url=db_url).returncode == 0
    procs: list[Any] = []
    try:
        procs = [
            spawn_worker(db_url, "--concurrency", "2", log=tmp_path / f"w{i}.log", **APP)
            for i in range(3)
        ]
        assert wait_until(lambda: len(ticks(db_url)) >= 4, 60, step=0.2)
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        down = len(ticks(db_url))
        time.sleep(3)  # nothing runs a scheduler: these ticks are fired on the way back
        procs = [
            spawn_worker(db_url, "--concurrency", "2", log=tmp_path / f"r{i}.log", **APP)
            for i in range(2)
        ]
        assert wait_until(lambda: len(ticks(db_url)) >= down + 6, 60, step=0.2)
    finally:
        stop(procs)
    fired = ticks(db_url)
    assert {(b - a).total_seconds() for a, b in pairwise(fired)} == {1.0}, fired


def test_schedules_command__list_pause_resume_trigger(db_url: str, tmp_path: Path) -> None:
    empty = steptrail("schedules", url=db_url, **APP)
    if db_url.startswith("sqlite"):  # a fresh file: no schema, and a read creates none
        assert empty.returncode == 3
    else:  # the session's database has the schema (emptied for this test)
        assert empty.returncode == 0, empty.stderr
    worker = spawn_worker(db_url, "--concurrency", "1", log=tmp_path / "w.log", **APP)
    try:
        assert wait_until(lambda: len(ticks(db_url)) >= 1, 60, step=0.2)
    finally:
        stop([worker])
    listed = json.loads(steptrail("schedules", "--json", url=db_url, **APP).stdout)
    assert [(s["name"], s["cron"], s["paused"]) for s in listed] == [
        ("every-second", "* * * * * *", False)
    ]
    table = steptrail("schedules", url=db_url, COLUMNS="200", **APP)
    assert "every-second" in table.stdout
    assert "active" in table.stdout
    assert (
        steptrail(
            "schedules", "pause", "every-second", "--by", "alice", url=db_url, **APP
        ).returncode
        == 0
    )
    assert (
        json.loads(steptrail("schedules", "--json", url=db_url, **APP).stdout)[0]["paused"] is True
    )
    made = steptrail(
        "schedules", "trigger", "every-second", "--by", "bob", "--json", url=db_url, **APP
    )
    assert made.returncode == 0, made.stderr
    run_id = json.loads(made.stdout)["run_id"]
    shown = json.loads(steptrail("show", run_id, "--json", url=db_url, **APP).stdout)
    assert shown["events"][0]["actor"] == "bob"
    assert (
        steptrail(
            "schedules", "resume", "every-second", "--by", "alice", url=db_url, **APP
        ).returncode
        == 0
    )
    unknown = steptrail("schedules", "pause", "nightly", "--by", "alice", url=db_url, **APP)
    assert unknown.returncode == 1
    assert "nightly" in unknown.stderr
    bare = steptrail("schedules", "pause", "every-second", url=db_url, **APP)
    assert bare.returncode == 2  # --by is required
