"""Async agents in real worker processes: SIGKILL while hundreds of awaits are in flight,
reclaim and finish on another worker; SIGTERM lets async runs in flight finish."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from steptrail.domain.enums import RunStatus
from steptrail.domain.run import Run
from tests.acceptance import agents
from tests.acceptance.helpers import spawn_worker
from tests.acceptance.test_faults import check_trails, stop, wait_until
from tests.conftest import make_runtime

pytestmark = pytest.mark.slow


def test_async_crash__sigkilled_worker_runs_reclaimed_and_finished(
    db_url: str, tmp_path: Path
) -> None:
    """A worker holding 40 async runs mid-step is SIGKILLed; the reaper reclaims them after
    the lease, another worker finishes every one, and each run's write happened once."""
    lease = "1.5"
    rt = make_runtime(db_url, app=agents.app, lease_seconds=float(lease))
    counter, witness = tmp_path / "steps.txt", tmp_path / "sent.txt"
    request = {"steps": 4, "sleep": 0.4, "counter": str(counter), "witness": str(witness)}
    procs = []
    try:
        ids = [rt.enqueue("witnessed_async", request) for _ in range(40)]
        env = {"STEPTRAIL_LEASE_SECONDS": lease}
        procs.append(spawn_worker(db_url, "--concurrency", "100", log=tmp_path / "w1.log", **env))
        assert wait_until(lambda: counter.exists() and len(counter.read_text()) > 0, 30)
        assert wait_until(lambda: rt.get(ids[0]).state.steps >= 1, 30)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        before = Counter(counter.read_text().split("\n"))
        running = [i for i in ids if rt.get(i).status is RunStatus.RUNNING]
        assert running, "the kill should have stranded runs"
        reaper = rt.reaper()
        assert wait_until(lambda: reaper.reap_once(100).requeued > 0, 30, step=0.2)
        procs.append(spawn_worker(db_url, "--concurrency", "100", log=tmp_path / "w2.log", **env))
        assert wait_until(
            lambda: (
                (reaper.reap_once(100) is not None)
                and all(rt.get(i).status.is_terminal for i in ids)
            ),
            90,
            step=0.3,
        )
        trails = check_trails(rt, ids)
        assert all(rt.get(i).status is RunStatus.COMPLETED for i in ids)
        reclaimed = [i for i, t in trails.items() if any(isinstance(e, Run.Reclaimed) for e in t)]
        assert set(running) <= set(reclaimed)
        sent = Counter(line.split()[0] for line in witness.read_text().splitlines())
        assert all(sent[str(i)] == 1 for i in ids), sent
        assert sum(before.values()) > 0
        # Durable replay: a step whose record landed before the kill ran exactly once; only
        # the step in flight at the kill may have run twice.
        ran = Counter(counter.read_text().splitlines())
        for run_id, trail in trails.items():
            cut = next((k for k, e in enumerate(trail) if isinstance(e, Run.Reclaimed)), len(trail))
            landed = [e.name for e in trail[:cut] if isinstance(e, Run.StepRecorded)]
            assert all(ran[f"{run_id} {name}"] == 1 for name in landed), (run_id, landed)
            assert all(v <= 2 for k, v in ran.items() if k.startswith(str(run_id)))
    finally:
        stop(procs)
        rt.close()


def test_async_sigterm__worker_finishes_async_runs_in_flight_then_exits(
    db_url: str, tmp_path: Path
) -> None:
    """The first SIGTERM stops claiming; async runs in flight finish; the worker exits 0."""
    rt = make_runtime(db_url, app=agents.app, lease_seconds=30)
    counter, witness = tmp_path / "steps.txt", tmp_path / "sent.txt"
    request = {"steps": 3, "sleep": 0.3, "counter": str(counter), "witness": str(witness)}
    try:
        slow = [rt.enqueue("witnessed_async", request) for _ in range(5)]
        worker = spawn_worker(db_url, "--concurrency", "5", log=tmp_path / "w.log")
        assert wait_until(lambda: all(rt.get(i).status is RunStatus.RUNNING for i in slow), 30)
        later = rt.enqueue("witnessed_async", request)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        assert all(rt.get(i).status is RunStatus.COMPLETED for i in slow)
        assert rt.get(later).status is RunStatus.QUEUED
    finally:
        rt.close()


def test_pydantic_ai_crash__model_called_once_per_recorded_request_and_write_once(
    db_url: str, tmp_path: Path
) -> None:
    """A worker running a pydantic-ai agent is SIGKILLed after its write, during its last
    model request; after the reclaim another worker finishes the run: every model request
    that was recorded was made once (only the one in flight at the kill twice), and the
    write ran once."""
    pytest.importorskip("pydantic_ai")
    lease = "1.5"
    rt = make_runtime(db_url, app=agents.app, lease_seconds=float(lease))
    model_log, witness, hang = tmp_path / "model.txt", tmp_path / "sent.txt", tmp_path / "hang"
    hang.touch()
    request = {"model_log": str(model_log), "witness": str(witness), "hang": str(hang)}
    env = {"STEPTRAIL_LEASE_SECONDS": lease}
    procs = []
    try:
        run_id = rt.enqueue("pai_mailer", request)
        procs.append(spawn_worker(db_url, log=tmp_path / "w1.log", **env))
        assert wait_until(lambda: model_log.exists() and "pai_send" in model_log.read_text(), 30)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        hang.unlink()
        assert [
            s.kind for s in (h.event for h in rt.history(run_id)) if isinstance(s, Run.StepRecorded)
        ] == [
            "llm",
            "tool",
            "llm",
            "tool",
        ]
        reaper = rt.reaper()
        assert wait_until(lambda: reaper.reap_once(10).requeued == 1, 30, step=0.2)
        procs.append(spawn_worker(db_url, "--burst", log=tmp_path / "w2.log", **env))
        assert procs[1].wait(60) == 0
        assert rt.get(run_id).status is RunStatus.COMPLETED
        stages = Counter(line.split()[1] for line in model_log.read_text().splitlines())
        # start and lookup were recorded before the kill: made once; the final request was
        # in flight at the kill: made twice.
        assert stages == Counter({"start": 1, "lookup": 1, "pai_send": 2})
        assert len(witness.read_text().splitlines()) == 1
        replayed = [h.event for h in rt.history(run_id) if isinstance(h.event, Run.Replayed)]
        assert [e.count for e in replayed] == [4]
    finally:
        stop(procs)
        rt.close()


def test_openai_agents_crash__model_not_called_again_approval_bound_to_arguments(
    db_url: str, tmp_path: Path
) -> None:
    """A worker running an Agents SDK agent is SIGKILLed after its first model call was
    recorded (in the tool that call asked for); after the reclaim another worker replays
    that response instead of calling the model again, the write waits for an approval bound
    to its exact arguments (a changed-argument digest is refused), and runs once."""
    pytest.importorskip("agents")
    from steptrail.domain.decisions import PendingCall, calls_digest
    from steptrail.domain.errors import DigestMismatch

    lease = "1.5"
    rt = make_runtime(db_url, app=agents.app, lease_seconds=float(lease))
    model_log, witness, hang = tmp_path / "model.txt", tmp_path / "sent.txt", tmp_path / "hang"
    hang.touch()
    request = {"model_log": str(model_log), "witness": str(witness), "hang": str(hang)}
    env = {"STEPTRAIL_LEASE_SECONDS": lease}
    procs = []
    try:
        run_id = rt.enqueue("oa_mailer", request)
        procs.append(spawn_worker(db_url, log=tmp_path / "w1.log", **env))
        # lookup starts only once the first model call's record is durable (its boundary).
        assert wait_until(lambda: model_log.exists() and "start" in model_log.read_text(), 30)
        assert wait_until(lambda: len(steps_of(rt, run_id)) == 1, 30)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        hang.unlink()
        reaper = rt.reaper()
        assert wait_until(lambda: reaper.reap_once(10).requeued == 1, 30, step=0.2)
        procs.append(spawn_worker(db_url, "--burst", log=tmp_path / "w2.log", **env))
        assert procs[1].wait(60) == 0
        assert rt.get(run_id).status is RunStatus.WAITING_FOR_APPROVAL
        stages = Counter(line.split()[1] for line in model_log.read_text().splitlines())
        assert stages == Counter({"start": 1, "lookup": 1})  # the first not called again
        mail = {"to": "a@example.com", "body": "sunny in Oslo"}
        changed = [PendingCall(name="oa_send", arguments={**mail, "to": "b@x.org"}, id="c2")]
        with pytest.raises(DigestMismatch):
            rt.approve(run_id, by="mallory", digest=calls_digest(changed))
        exact = [PendingCall(name="oa_send", arguments=mail, id="c2")]
        rt.approve(run_id, by="alice", digest=calls_digest(exact))
        procs.append(spawn_worker(db_url, "--burst", log=tmp_path / "w3.log", **env))
        assert procs[2].wait(60) == 0
        assert rt.get(run_id).status is RunStatus.COMPLETED
        stages = Counter(line.split()[1] for line in model_log.read_text().splitlines())
        assert stages == Counter({"start": 1, "lookup": 1, "oa_send": 1})
        assert len(witness.read_text().splitlines()) == 1
    finally:
        stop(procs)
        rt.close()


def steps_of(rt: Any, run_id: Any) -> list[Run.StepRecorded]:
    return [h.event for h in rt.history(run_id) if isinstance(h.event, Run.StepRecorded)]
