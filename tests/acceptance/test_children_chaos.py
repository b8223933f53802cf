"""The issue's chaos test for child runs (ADR 0075), on SQLite and PostgreSQL: a parent fans
out to 20 children while worker processes holding the parent or its children are SIGKILLed
at random. It ends with exactly 20 children ever created, each completed once, the parent's
result holding all 20 results, and at no sampled moment a waiting run holding a lease.

Short leases keep it fast; every loop is bounded by a deadline.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from steptrail.domain.enums import RunStatus
from steptrail.domain.run import Run
from tests.acceptance import agents
from tests.acceptance.helpers import replace_worker, spawn_worker, steptrail
from tests.acceptance.test_faults import check_trails, stop
from tests.conftest import make_runtime

pytestmark = pytest.mark.slow
CHILDREN = 20


def test_chaos__a_fanout_of_20_survives_sigkills_of_parent_and_children(
    db_url: str, tmp_path: Path
) -> None:
    # A budget above the kills: every child must complete, none may be dead-lettered for
    # having been on the killed workers too often (that path fails the parent, as tested
    # in test_children.py).
    rt = make_runtime(db_url, agents.app, lease_seconds=1.5, privacy_level="full", max_requeues=20)
    rng = random.Random(27)
    env = {
        "STEPTRAIL_LEASE_SECONDS": "1.5",
        "STEPTRAIL_PRIVACY_LEVEL": "full",
        "STEPTRAIL_MAX_REQUEUES": "20",
    }
    procs: list[subprocess.Popen[Any]] = []
    try:
        parent = rt.enqueue("chaos_parent", {"n": CHILDREN, "sleep": 0.15})
        logs = [tmp_path / f"w{i}.log" for i in range(3)]
        procs = [spawn_worker(db_url, "--concurrency", "4", log=log, **env) for log in logs]
        reaper = rt.reaper()
        kills, samples, parent_killed = 0, 0, False
        deadline = time.monotonic() + 150
        next_kill = time.monotonic() + 0.8
        while time.monotonic() < deadline and not rt.get(parent).status.is_terminal:
            rows = rt.store.all_rows()
            samples += 1
            for row in rows:  # a waiting run holds no lease, whoever looks when
                if row.status.is_waiting:
                    assert (row.state.holder, row.lease_expires_at) == (None, None), row
            busy = [i for i, log in enumerate(logs) if "run_claimed" in log.read_text()]
            top = next(r for r in rows if r.run_id == parent)
            holder = top.state.holder or ""
            if not parent_killed:
                # The first kill is of the parent's worker, half-way through its fan-out (the
                # holder names the worker's process id), so a replay crosses its starts.
                victims = [
                    i for i, p in enumerate(procs) if f":{p.pid}:" in holder and top.state.steps > 8
                ]
            else:
                victims = busy if kills < 8 and time.monotonic() >= next_kill else []
            if victims:
                victim = rng.choice(victims)
                parent_killed = parent_killed or f":{procs[victim].pid}:" in holder
                kills += 1
                replace_worker(procs, logs, victim, db_url, tmp_path / f"r{kills}.log", **env)
                next_kill = time.monotonic() + rng.uniform(0.3, 0.8)
            reaper.reap_once(50)
            time.sleep(0.1)
        assert kills >= 4
        assert parent_killed
        assert samples > 10
        assert rt.get(parent).status is RunStatus.COMPLETED, rt.get(parent).state
        children = rt.store.children(parent)
        everything = rt.store.all_rows()
        assert len(children) == CHILDREN  # exactly 20 ever created
        assert len(everything) == CHILDREN + 1
        assert {c.status for c in children} == {RunStatus.COMPLETED}
        trails = check_trails(rt, [parent, *(c.run_id for c in children)])
        (done,) = [e for e in trails[parent] if isinstance(e, Run.Completed)]
        assert done.result == {
            "result": {"results": [{"n": n, "square": n * n} for n in range(CHILDREN)]}
        }
        starts = [
            e for e in trails[parent] if isinstance(e, Run.StepRecorded) and e.kind == "child"
        ]
        assert len(starts) == CHILDREN
        reclaimed = [i for i, t in trails.items() if any(isinstance(e, Run.Reclaimed) for e in t)]
        assert parent in reclaimed
        assert len(reclaimed) > 1, "the kills should have stranded children too"
        rt.project()
        assert rt.verify() == []
    finally:
        stop(procs)
        rt.close()


def test_show__the_command_line_links_a_family_both_ways(db_url: str) -> None:
    """`steptrail show` lists a parent's children and names a child's parent, in text and
    in `--json`."""
    rt = make_runtime(db_url, agents.app, privacy_level="full")
    try:
        parent = rt.enqueue("chaos_parent", {"n": 2, "sleep": 0})
        deadline = time.monotonic() + 30
        while not rt.get(parent).status.is_terminal:
            assert time.monotonic() < deadline
            rt.work(burst=True)
        children = rt.store.children(parent)
    finally:
        rt.close()
    shown = json.loads(steptrail("show", str(parent), "--json", url=db_url).stdout)
    assert shown["family"]["parent"] is None
    assert sorted(c["id"] for c in shown["family"]["children"]) == sorted(
        str(c.run_id) for c in children
    )
    text = steptrail("show", str(children[0].run_id), url=db_url).stdout
    assert f"parent: {parent} chaos_parent completed" in text
    assert "children (2):" in steptrail("show", str(parent), url=db_url).stdout
