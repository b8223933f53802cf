"""Your projections and the event feed under real processes: SIGKILLed workers and
projector, and a feed consumer restarted every 1,000 events while four workers append.

Every loop is bounded by a deadline. `STEPTRAIL_FEED_EVENTS` scales the feed test (the
issue's figure is 50,000; the default keeps the suite short on a shared machine).
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from typer.testing import CliRunner

from examples.cost_per_agent_day import app as cost_app
from steptrail.cli import cli
from steptrail.infrastructure.logging import configure_logging
from steptrail.runtime import Runtime
from tests.acceptance.helpers import REPO, env_for, spawn_worker
from tests.acceptance.test_faults import all_terminal, check_trails, stop, wait_until
from tests.conftest import make_runtime

pytestmark = pytest.mark.slow
COST_APP = "examples.cost_per_agent_day:app"


def spawn_projector(url: str, log: Path) -> subprocess.Popen[Any]:
    """`steptrail project --every 0.05` with the example projection, in the background."""
    handle = log.open("a")
    return subprocess.Popen(
        [sys.executable, "-m", "steptrail", "project", "--every", "0.05"],
        cwd=REPO,
        env=env_for(url, STEPTRAIL_APP=COST_APP, STEPTRAIL_LEASE_SECONDS="1.5"),
        stdout=handle,
        stderr=handle,
    )


def fold_from_show(url: str, run_ids: list[UUID]) -> dict[tuple[str, str], list[Any]]:
    """Steps, tokens and cost per (agent, UTC day), from `show --json` of every run."""
    runner = CliRunner()
    expected: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, 0.0])
    for run_id in run_ids:
        result = runner.invoke(cli, ["--database-url", url, "show", str(run_id), "--json"])
        # The command configured logging onto the runner's stream, closed now: undo that.
        configure_logging("console", "warning")
        assert result.exit_code == 0, result.output
        shown = json.loads(result.stdout)
        agent = shown["run"]["agent"] if "run" in shown else shown["state"]["agent"]
        for entry in shown["events"]:
            if entry["event"] == "StepRecorded":
                row = expected[(agent, entry["recorded_at"][:10])]
                row[0] += 1
                row[1] += entry["tokens"]
                row[2] += entry["cost"]
    return dict(expected)


def lag_zero(rt: Runtime) -> bool:
    return all(t.lag == 0 for t in rt.tracked())


def live_costs(rt: Runtime) -> dict[tuple[str, str], list[Any]]:
    with rt.store.reporting_read() as tx:
        return {(r[0], r[1]): [r[2], r[3], r[4]] for r in tx.rows_of("cost_per_agent_day")}


def test_chaos__projection_equals_a_fold_of_every_shown_run(db_url: str, tmp_path: Path) -> None:
    """Workers and the projector are SIGKILLed at random mid-batch; afterwards the example
    projection equals the fold of `show --json` of every run: no step counted twice or
    missed, and `verify` is clean."""
    rt = make_runtime(db_url, cost_app, lease_seconds=1.5)
    rng = random.Random(14)
    env = {"STEPTRAIL_LEASE_SECONDS": "1.5", "STEPTRAIL_APP": COST_APP}
    procs: list[subprocess.Popen[Any]] = []
    try:
        ids = [rt.enqueue("scripted", {"steps": 5, "sleep": 0.05}) for _ in range(60)]
        procs = [
            spawn_worker(db_url, "--concurrency", "4", log=tmp_path / f"w{i}.log", **env)
            for i in range(2)
        ]
        procs.append(spawn_projector(db_url, tmp_path / "p0.log"))
        reaper = rt.reaper()
        kills = {"worker": 0, "projector": 0}
        deadline = time.monotonic() + 120
        next_kill = time.monotonic() + 0.4
        while time.monotonic() < deadline and not all_terminal(rt, ids):
            if sum(kills.values()) < 8 and time.monotonic() >= next_kill:
                n = sum(kills.values())
                # Alternate: the projector, then one of the workers, and so on.
                victim = len(procs) - 1 if n % 2 == 0 else rng.randrange(len(procs) - 1)
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                if victim == len(procs) - 1:
                    kills["projector"] += 1
                    procs[victim] = spawn_projector(db_url, tmp_path / f"p{n}.log")
                else:
                    kills["worker"] += 1
                    procs[victim] = spawn_worker(
                        db_url, "--concurrency", "4", log=tmp_path / f"r{n}.log", **env
                    )
                next_kill = time.monotonic() + rng.uniform(0.2, 0.6)
            reaper.reap_once(50)
            time.sleep(0.1)
        # The projector dies once more at a random moment of its catch-up.
        procs[-1].send_signal(signal.SIGKILL)
        procs[-1].wait()
        kills["projector"] += 1
        assert kills["worker"] >= 1, kills
        assert kills["projector"] >= 2, kills
        assert all_terminal(rt, ids)
        check_trails(rt, ids)
        procs[-1] = spawn_projector(db_url, tmp_path / "last.log")
        store = rt.projection("cost_per_agent_day")
        assert wait_until(lambda: store.position() >= rt.views.position() > (0, 0), 60)
        stop(procs)
        # PostgreSQL: a transaction open elsewhere in the shared cluster may hide the tail
        # for a moment (ADR 0012); project until nothing is left.
        assert wait_until(lambda: rt.project_all() and store.catch_up() == 0 and lag_zero(rt), 60)
        expected = fold_from_show(db_url, ids)
        assert live_costs(rt).keys() == expected.keys()
        for key, (steps, tokens, cost) in expected.items():
            assert live_costs(rt)[key][:2] == [steps, tokens], key
            assert live_costs(rt)[key][2] == pytest.approx(cost), key
        assert rt.verify("cost_per_agent_day") == []
    finally:
        stop(procs)
        rt.close()


def _pump(stream: Any, into: queue.Queue[str | None]) -> None:
    """Every line of `stream` into `into`, then None at its end."""
    for line in stream:
        into.put(line)
    into.put(None)


class Consumer:
    """`steptrail events --follow --json`, killed and restarted from its last position every
    `every` events; keeps every line it handled. It never waits past its deadline, nor on a
    stream that can no longer grow (`alive` says whether the writers are still there)."""

    def __init__(self, url: str, every: int, alive: Any = lambda: True) -> None:
        self.url = url
        self.every = every
        self.alive = alive
        self.lines: list[dict[str, Any]] = []
        self.position = "0:0"
        self.restarts = 0

    def run(self, total: int, deadline: float) -> None:
        while len(self.lines) < total and time.monotonic() < deadline:
            assert self.alive(), "a worker died: the log cannot reach its total"
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "steptrail",
                    "events",
                    "--follow",
                    "--json",
                    "--every",
                    "0.05",
                    "--after",
                    self.position,
                ],
                cwd=REPO,
                env=env_for(self.url, STEPTRAIL_LOG_LEVEL="warning"),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            assert proc.stdout is not None
            lines: queue.Queue[str | None] = queue.Queue()
            threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
            taken = 0
            try:
                while time.monotonic() < deadline:
                    try:
                        line = lines.get(timeout=0.5)
                    except queue.Empty:
                        assert self.alive(), "a worker died: the log cannot reach its total"
                        continue
                    if line is None:
                        break
                    entry = json.loads(line)
                    self.lines.append(entry)
                    self.position = entry["position"]  # saved after handling, as a consumer would
                    taken += 1
                    if taken >= self.every or len(self.lines) >= total:
                        break
            finally:
                proc.send_signal(signal.SIGKILL)  # mid-stream: lines it had written are dropped
                proc.wait()
            self.restarts += 1


def test_feed__restarted_consumer_equals_the_log_while_four_workers_append(
    db_url: str, tmp_path: Path
) -> None:
    """A consumer of `events --follow` restarted every 1,000 events, while four workers
    append (and runs are still being enqueued), collects exactly the log: every event once,
    in order, with its payload."""
    target = int(os.environ.get("STEPTRAIL_FEED_EVENTS", "12000"))
    runs = target // 7  # Queued, Claimed, 4 steps, Completed
    rt = make_runtime(db_url, lease_seconds=30)
    procs: list[subprocess.Popen[Any]] = []
    ids: list[UUID] = []
    try:
        procs = [
            spawn_worker(db_url, "--concurrency", "2", "--no-views", log=tmp_path / f"w{i}.log")
            for i in range(4)
        ]

        def enqueue() -> None:
            for _ in range(runs):
                ids.append(rt.enqueue("scripted", {"steps": 4}))

        producer = threading.Thread(target=enqueue)
        producer.start()
        consumer = Consumer(db_url, every=1000, alive=lambda: all(p.poll() is None for p in procs))
        deadline = time.monotonic() + 600
        # Consume while the log grows; then until the consumer has everything.
        consumer.run(runs * 7, deadline)
        producer.join()
        assert wait_until(lambda: all_terminal(rt, ids), 120)
        total = rt.views.head()
        assert total == runs * 7
        consumer.run(total, deadline)
        assert consumer.restarts >= total // 1000
        got = [(e["run_id"], e["version"], e["event"], e["data"]) for e in consumer.lines]
        assert len(got) == len({(g[0], g[1]) for g in got}) == total  # nothing twice
        positions = [tuple(map(int, e["position"].split(":"))) for e in consumer.lines]
        assert positions == sorted(positions)
        log = {}
        for run_id in ids:
            for h in rt.history(run_id):
                data = h.event.model_dump(mode="json", exclude={"actor"})
                log[(str(run_id), h.version)] = (type(h.event).__name__, data)
        assert {(g[0], g[1]): (g[2], g[3]) for g in got} == log
    finally:
        stop(procs)
        rt.close()
