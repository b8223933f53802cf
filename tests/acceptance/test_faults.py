"""Fault injection with real worker processes sharing one database: claim exactly once,
SIGKILL crashes and a SIGSTOPped zombie on SQLite and PostgreSQL; connections cut under
load and the poison-run guard on PostgreSQL.

Short leases keep these fast; every loop is bounded by a deadline.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from steptrail.domain.enums import RunStatus, TerminationReason
from steptrail.domain.errors import StoreUnavailable
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
from tests.acceptance import agents
from tests.acceptance.helpers import replace_worker, spawn_worker, steptrail
from tests.conftest import make_runtime

pytestmark = pytest.mark.slow
TERMINAL_EVENTS = (Run.Completed, Run.Failed, Run.Cancelled, Run.DeadLettered)


def wait_until(predicate: Any, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def all_terminal(rt: Runtime, ids: list[UUID]) -> bool:
    try:
        return all(rt.get(i).status.is_terminal for i in ids)
    except StoreUnavailable:  # the test's own connection was cut with everybody else's
        return False


def stop(procs: list[subprocess.Popen[Any]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def check_trails(rt: Runtime, ids: list[UUID]) -> dict[UUID, list[Any]]:
    """Invariants of every run's log: contiguous versions, gap-free step numbers, exactly one
    terminal event and nothing after it."""
    trails = {}
    for run_id in ids:
        trail = rt.history(run_id)
        events = [h.event for h in trail]
        assert [h.version for h in trail] == list(range(1, len(trail) + 1))
        seqs = [e.seq for e in events if isinstance(e, Run.StepRecorded)]
        assert seqs == list(range(1, len(seqs) + 1)), (run_id, seqs)
        terminal = [i for i, e in enumerate(events) if isinstance(e, TERMINAL_EVENTS)]
        assert len(terminal) == 1, (run_id, [type(e).__name__ for e in events])
        assert terminal[0] == len(events) - 1
        trails[run_id] = events
    return trails


def test_workers__each_run_claimed_exactly_once(db_url: str, tmp_path: Path) -> None:
    """Four worker processes drain one queue; every run is claimed once and completed."""
    rt = make_runtime(db_url, lease_seconds=30)
    procs: list[subprocess.Popen[Any]] = []
    try:
        procs = [
            spawn_worker(db_url, "--concurrency", "3", log=tmp_path / f"w{i}.log") for i in range(4)
        ]
        # Every worker is polling before the first run exists: a worker that started first
        # must not drain the queue alone (SQLite claims a batch in microseconds).
        assert wait_until(
            lambda: all("worker_started" in (tmp_path / f"w{i}.log").read_text() for i in range(4)),
            60,
        )
        ids = [rt.enqueue("scripted", {"steps": 1, "sleep": 0.02}) for _ in range(150)]
        assert wait_until(lambda: all_terminal(rt, ids), 90)
        trails = check_trails(rt, ids)
        for events in trails.values():
            assert sum(isinstance(e, Run.Claimed) for e in events) == 1
            assert isinstance(events[-1], Run.Completed)
        holders = Counter(e.actor for t in trails.values() for e in t if isinstance(e, Run.Claimed))
        assert len(holders) >= 2
        rt.project()
        assert rt.verify() == []
    finally:
        stop(procs)
        rt.close()


def executions(witness: Path, run_id: UUID) -> Counter[int]:
    """How many times each scripted step really ran (its witness file, outside the DB)."""
    path = witness / str(run_id)
    return Counter(int(k) for k in path.read_text().split()) if path.exists() else Counter()


def check_executions(rt: Runtime, witness: Path, trails: dict[UUID, list[Any]]) -> None:
    """Per run: every step whose record landed ran once, except that each crash may have
    re-run the one step in flight (at most one step is ever unrecorded); and a completed
    run's journal is empty (a failed one keeps it for a retry, ADR 0070)."""
    for run_id, events in trails.items():
        counts = executions(witness, run_id)
        crashes = sum(isinstance(e, Run.Reclaimed) for e in events)
        names = [e.name for e in events if isinstance(e, Run.StepRecorded)]
        assert len(names) == len(set(names)), (run_id, names)  # no step recorded twice
        for name in names:
            assert 1 <= counts[int(name.removeprefix("think-"))] <= 1 + crashes, (run_id, counts)
        assert sum(counts.values()) - len(counts) <= crashes, (run_id, counts, crashes)
        if isinstance(events[-1], Run.Completed):
            assert sorted(counts) == list(range(1, 7)), (run_id, counts)
        if not isinstance(events[-1], (Run.Failed, Run.DeadLettered)):
            assert rt.store.journal(run_id) == [], run_id


def test_crash__sigkilled_workers_runs_still_finish_once(db_url: str, tmp_path: Path) -> None:
    """Workers are SIGKILLed at random while the reaper runs; every run ends exactly once,
    a run that lost its worker finished after a reclaim or was dead-lettered for it, every
    step whose record landed was executed once (counted outside the database), and every
    settled run's journal is empty."""
    rt = make_runtime(db_url, lease_seconds=1.5)
    rng = random.Random(7)
    procs: list[subprocess.Popen[Any]] = []
    env = {"STEPTRAIL_LEASE_SECONDS": "1.5"}
    witness = tmp_path / "witness"
    witness.mkdir()
    try:
        request = {"steps": 6, "sleep": 0.1, "witness": str(witness)}
        ids = [rt.enqueue("scripted", request) for _ in range(60)]
        logs = [tmp_path / f"w{i}.log" for i in range(3)]
        procs = [spawn_worker(db_url, "--concurrency", "4", log=log, **env) for log in logs]
        reaper = rt.reaper()
        kills = 0
        deadline = time.monotonic() + 120
        next_kill = time.monotonic() + 0.5
        while time.monotonic() < deadline and not all_terminal(rt, ids):
            # Kill only a worker that has claimed work: on a loaded machine a freshly started
            # one may still be importing, and killing it would strand nothing.
            busy = [i for i, log in enumerate(logs) if "run_claimed" in log.read_text()]
            if kills < 6 and busy and time.monotonic() >= next_kill:
                kills += 1
                replace_worker(
                    procs, logs, rng.choice(busy), db_url, tmp_path / f"r{kills}.log", **env
                )
                next_kill = time.monotonic() + rng.uniform(0.3, 0.7)
            reaper.reap_once(50)
            time.sleep(0.2)
        assert kills >= 3
        assert all_terminal(rt, ids)
        trails = check_trails(rt, ids)
        reclaimed = [i for i, t in trails.items() if any(isinstance(e, Run.Reclaimed) for e in t)]
        assert reclaimed, "the kills should have stranded at least one run"
        for run_id in reclaimed:
            row = rt.get(run_id)
            assert row.status is RunStatus.COMPLETED or (
                row.state.reason is TerminationReason.RETRIES_EXHAUSTED
            ), (run_id, row.state)
        check_executions(rt, witness, trails)
        replays = [e for t in trails.values() for e in t if isinstance(e, Run.Replayed)]
        assert replays, "a reclaimed run that had recorded steps should have replayed them"
        rt.project()
        assert rt.verify() == []
    finally:
        stop(procs)
        rt.close()


def test_crash__sigkill_at_step_4_of_6_resumes_from_the_journal(
    db_url: str, tmp_path: Path
) -> None:
    """A worker is SIGKILLed in the middle of step 4 of 6; the reaper reclaims the run and
    another worker process finishes it: steps 1-3 ran exactly once in total, 5-6 once, and
    only step 4 (in flight at the kill) ran twice (counted outside the database)."""
    rt = make_runtime(db_url, lease_seconds=1.0)
    env = {"STEPTRAIL_LEASE_SECONDS": "1.0"}
    witness = tmp_path / "witness"
    witness.mkdir()
    procs: list[subprocess.Popen[Any]] = []
    try:
        run_id = rt.enqueue(
            "scripted",
            {"steps": 6, "crash": {"at": 4, "times": 1}, "witness": str(witness)},
        )
        procs.append(spawn_worker(db_url, log=tmp_path / "victim.log", **env))
        assert procs[0].wait(60) == -signal.SIGKILL
        assert rt.get(run_id).status is RunStatus.RUNNING
        assert wait_until(lambda: rt.reap().requeued == 1, 15, step=0.2)
        procs.append(spawn_worker(db_url, log=tmp_path / "rescuer.log", **env))
        assert wait_until(lambda: rt.get(run_id).status.is_terminal, 60)
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert executions(witness, run_id) == {1: 1, 2: 1, 3: 1, 4: 2, 5: 1, 6: 1}
        trail = check_trails(rt, [run_id])[run_id]
        assert [(e.count, e.last_seq) for e in trail if isinstance(e, Run.Replayed)] == [(3, 3)]
        names = [e.name for e in trail if isinstance(e, Run.StepRecorded)]
        assert names == [f"think-{k}" for k in range(1, 7)]
        assert rt.store.journal(run_id) == []
    finally:
        stop(procs)
        rt.close()


@pytest.mark.parametrize(
    ("crash_at", "ends"),
    [(3, RunStatus.COMPLETED), (2, RunStatus.FAILED)],
    ids=["after-the-recorded-write", "inside-the-write"],
)
def test_crash__a_write_is_never_sent_twice(
    db_url: str, tmp_path: Path, crash_at: int, ends: RunStatus
) -> None:
    """A worker process is SIGKILLed after its e-mail (step 2) was recorded: the rescuer
    replays the write and finishes the run. Killed inside the write, whose result is
    unknown: the reaper dead-letters the run not_retryable instead of sending again.
    Either way one e-mail was sent (counted outside the database)."""
    rt = make_runtime(db_url, lease_seconds=1.0)
    env = {"STEPTRAIL_LEASE_SECONDS": "1.0"}
    witness = tmp_path / "witness"
    witness.mkdir()
    procs: list[subprocess.Popen[Any]] = []
    try:
        run_id = rt.enqueue(
            "scripted",
            {
                "steps": 4,
                "tool": {"effect": "non_idempotent_write", "at": 2},
                "crash": {"at": crash_at, "times": 1},
                "witness": str(witness),
            },
        )
        procs.append(spawn_worker(db_url, log=tmp_path / "victim.log", **env))
        assert procs[0].wait(60) == -signal.SIGKILL
        assert wait_until(lambda: rt.reap().reaped == 1, 15, step=0.2)
        procs.append(spawn_worker(db_url, log=tmp_path / "rescuer.log", **env))
        assert wait_until(lambda: rt.get(run_id).status.is_terminal, 60)
        row = rt.get(run_id)
        assert row.status is ends
        assert executions(witness, run_id)[2] == 1
        if ends is RunStatus.FAILED:
            assert row.state.reason is TerminationReason.NOT_RETRYABLE
            assert [p.tool for p in row.state.pending_effects] == ["send_email"]
            assert rt.store.journal(run_id) != []  # kept for a retry (ADR 0070)
        else:
            trail = check_trails(rt, [run_id])[run_id]
            assert [e.count for e in trail if isinstance(e, Run.Replayed)] == [2]
            assert rt.store.journal(run_id) == []
    finally:
        stop(procs)
        rt.close()


def holder_events(trail: list[Any], holder: str) -> list[str]:
    return [type(e).__name__ for e in trail if e.actor == holder]


def test_zombie__sigstopped_worker_resumed_after_reclaim_acts_no_more(
    db_url: str, tmp_path: Path
) -> None:
    """A worker paused past its lease is reclaimed; another finishes the run; resumed, the
    zombie records nothing, settles nothing, runs no write tool, and reports lease_lost."""
    rt = make_runtime(db_url, app=agents.app, lease_seconds=1.0)
    witness = tmp_path / "emails.txt"
    env = {"STEPTRAIL_LEASE_SECONDS": "1.0"}
    zombie_log = tmp_path / "zombie.log"
    procs: list[subprocess.Popen[Any]] = []
    try:
        run_id = rt.enqueue("witnessed", {"steps": 4, "sleep": 0.4, "witness": str(witness)})
        zombie = spawn_worker(db_url, log=zombie_log, **env)
        procs.append(zombie)
        assert wait_until(
            lambda: any(isinstance(h.event, Run.StepRecorded) for h in rt.history(run_id)), 30
        )
        # Pause it in the middle of a step, not in the millisecond of an append (on SQLite
        # a writer paused while holding the database's write lock would stall everyone).
        time.sleep(0.1)
        zombie.send_signal(signal.SIGSTOP)
        zombie_holder = rt.get(run_id).state.holder
        assert zombie_holder is not None
        assert wait_until(lambda: rt.reap().requeued == 1, 10, step=0.2)
        procs.append(spawn_worker(db_url, log=tmp_path / "rescuer.log", **env))
        assert wait_until(lambda: rt.get(run_id).status.is_terminal, 30)
        before = [h.event for h in rt.history(run_id)]
        zombie.send_signal(signal.SIGCONT)
        assert wait_until(lambda: "lease_lost" in zombie_log.read_text(), 15)
        zombie.terminate()
        zombie.wait(15)
        after = [h.event for h in rt.history(run_id)]
        assert after == before
        assert rt.get(run_id).status is RunStatus.COMPLETED
        reclaim_at = next(i for i, e in enumerate(after) if isinstance(e, Run.Reclaimed))
        assert holder_events(after[reclaim_at:], zombie_holder) == []
        assert len(witness.read_text().splitlines()) == 1
        report = json.loads(zombie_log.read_text().strip().splitlines()[-1])
        assert report["outcomes"] == {"lease_lost": 1}
    finally:
        stop(procs)
        rt.close()


def backends(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def terminate_backends(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def test_database_restart__workers_reconnect_and_nothing_is_lost(
    pg_url: str, tmp_path: Path
) -> None:
    """Every connection of every worker is cut, repeatedly, under load: workers reconnect,
    every run still ends exactly once, none is stuck."""
    rt = make_runtime(pg_url, lease_seconds=1.5)
    procs: list[subprocess.Popen[Any]] = []
    env = {"STEPTRAIL_LEASE_SECONDS": "1.5"}
    try:
        ids = [rt.enqueue("scripted", {"steps": 5, "sleep": 0.1}) for _ in range(120)]
        procs = [
            spawn_worker(pg_url, "--concurrency", "4", log=tmp_path / f"w{i}.log", **env)
            for i in range(2)
        ]
        assert wait_until(lambda: "run_claimed" in (tmp_path / "w1.log").read_text(), 30)
        cut = []
        for _ in range(4):
            time.sleep(0.4)
            # Wait for the workers to have reconnected, so that every cut cuts something.
            assert wait_until(lambda: backends(pg_url) > 0, 10, step=0.05)
            cut.append(terminate_backends(pg_url))
        assert all(n > 0 for n in cut)
        assert not all_terminal(rt, ids), "the cuts must land while runs are in flight"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all_terminal(rt, ids):
            with contextlib.suppress(StoreUnavailable):
                rt.reap()
            time.sleep(0.2)
        assert all(p.poll() is None for p in procs), "workers must survive lost connections"
        assert all_terminal(rt, ids)
        check_trails(rt, ids)
        assert all(rt.get(i).status is RunStatus.COMPLETED for i in ids)
    finally:
        stop(procs)
        rt.close()


def test_poison_run__crashing_every_worker_ends_retries_exhausted(
    pg_url: str, tmp_path: Path
) -> None:
    """A run that SIGKILLs whichever worker runs it is reclaimed until the shared budget is
    spent, then dead-lettered retries_exhausted, instead of looping forever."""
    rt = make_runtime(pg_url, lease_seconds=0.8)
    env = {"STEPTRAIL_LEASE_SECONDS": "0.8"}
    procs: list[subprocess.Popen[Any]] = []
    try:
        poison = rt.enqueue("scripted", {"steps": 2, "crash": {"at": 1}})
        healthy = rt.enqueue("scripted", {"steps": 2})
        deadline = time.monotonic() + 60
        started = 0
        while time.monotonic() < deadline and not all_terminal(rt, [poison, healthy]):
            if not procs or procs[-1].poll() is not None:
                procs.append(spawn_worker(pg_url, log=tmp_path / f"w{started}.log", **env))
                started += 1
            rt.reap()
            time.sleep(0.2)
        row = rt.get(poison)
        assert row.state.reason is TerminationReason.RETRIES_EXHAUSTED
        assert row.state.requeue_count == 3
        trail = [h.event for h in rt.history(poison)]
        assert sum(isinstance(e, Run.Claimed) for e in trail) == 4
        assert rt.get(healthy).status is RunStatus.COMPLETED
    finally:
        stop(procs)
        rt.close()


def test_sigterm__worker_finishes_runs_in_flight_then_exits(db_url: str, tmp_path: Path) -> None:
    """The first SIGTERM stops claiming and lets the run in flight finish; the worker then
    exits cleanly and the next queued run is left for another worker."""
    rt = make_runtime(db_url, lease_seconds=30)
    try:
        slow = rt.enqueue("scripted", {"steps": 4, "sleep": 0.3})
        later = rt.enqueue("scripted", {"steps": 1})
        worker = spawn_worker(db_url, log=tmp_path / "w.log")
        assert wait_until(lambda: rt.get(slow).status is RunStatus.RUNNING, 30)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        assert rt.get(slow).status is RunStatus.COMPLETED
        assert rt.get(later).status is RunStatus.QUEUED
    finally:
        rt.close()


def hold_lock(pg_url: str, seconds: float, taken: threading.Event) -> None:
    """`LOCK TABLE` the run index and the log as a rebuild does, for `seconds`."""
    with psycopg.connect(pg_url) as conn:
        conn.execute("LOCK TABLE steptrail_runs, steptrail_events IN EXCLUSIVE MODE")
        taken.set()
        time.sleep(seconds)
        conn.commit()


@pytest.mark.parametrize("lock", [True, False], ids=["lock-table", "rebuild-only"])
def test_lock_waits__no_live_run_reclaimed(
    db_url: str, backend: str, lock: bool, tmp_path: Path
) -> None:
    """Workers run long runs under short leases while the reaper runs, `rebuild` runs
    again and again and (PostgreSQL) the log is locked for three lease lengths: every
    renewal that waited is honoured, no live run is reclaimed, every run completes once."""
    if lock and backend != "postgres":
        pytest.skip("LOCK TABLE is PostgreSQL's; SQLite's writers take turns on one lock")
    lease = 1.0
    rt = make_runtime(db_url, lease_seconds=lease)
    env = {"STEPTRAIL_LEASE_SECONDS": str(lease)}
    procs: list[subprocess.Popen[Any]] = []
    stop_reaper = threading.Event()
    reaper = threading.Thread(
        target=rt.reaper().reap_every, args=(0.1,), kwargs={"stop": stop_reaper}
    )
    try:
        # Long enough that the first rebuild (a CLI subprocess) ends with runs in flight even
        # on a loaded machine.
        ids = [rt.enqueue("scripted", {"steps": 40, "sleep": 0.3}) for _ in range(6)]
        procs = [
            spawn_worker(db_url, "--concurrency", "3", log=tmp_path / f"w{i}.log", **env)
            for i in range(2)
        ]
        reaper.start()
        assert wait_until(
            lambda: sum(r.status is RunStatus.RUNNING for r in rt.runs(limit=10)) >= 4, 30
        )
        rebuilds: list[tuple[int, bool]] = []  # (exit code, runs still in flight after it)

        def rebuild_again_and_again() -> None:
            for _ in range(3):
                done = steptrail("rebuild", url=db_url, **env)
                rebuilds.append((done.returncode, not all_terminal(rt, ids)))

        rebuilder = threading.Thread(target=rebuild_again_and_again)
        rebuilder.start()
        if lock:
            taken = threading.Event()
            hold_lock(db_url, 3 * lease, taken)
            assert taken.is_set()
            assert not all_terminal(rt, ids), "the lock must be released with runs in flight"
        rebuilder.join(120)
        assert [code for code, _ in rebuilds] == [0, 0, 0]
        assert rebuilds[0][1], "a rebuild must end while runs are in flight"
        assert wait_until(lambda: all_terminal(rt, ids), 180)
        trails = check_trails(rt, ids)
        for run_id, events in trails.items():
            kinds = [type(e).__name__ for e in events]
            assert "Reclaimed" not in kinds, (run_id, kinds)
            assert kinds[-1] == "Completed", (run_id, kinds)
            assert kinds.count("Claimed") == 1, (run_id, kinds)
        rt.project()
        assert rt.verify() == []
    finally:
        stop_reaper.set()
        if reaper.is_alive():
            reaper.join(10)
        stop(procs)
        rt.close()
