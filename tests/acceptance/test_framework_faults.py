"""Framework agents in real worker processes: a LangGraph graph SIGKILLed in node 3 is
recovered on another worker without running nodes 1-2 again, its interrupt answered with
`steptrail approve` on the command line."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from steptrail.domain.enums import RunStatus
from steptrail.domain.run import Run
from tests.acceptance.helpers import spawn_worker, steptrail
from tests.acceptance.test_faults import stop, wait_until
from tests.conftest import make_runtime

pytestmark = pytest.mark.slow
APP = "tests.acceptance.langgraph_app:app"


def test_langgraph_crash__recovered_without_rerunning_nodes_approved_on_the_cli(
    db_url: str, tmp_path: Path
) -> None:
    """SIGKILL in node 3 (node 2's record durable); another worker replays nodes 1-2
    (executed once, counted in a file), suspends at the interrupt; `steptrail approve
    --digest` answers it; a third worker publishes once; the final state is an uncrashed
    run's."""
    pytest.importorskip("langgraph")
    from examples.langgraph_review import Counters, review_app
    from steptrail.testing import Kit

    clean = make_runtime(db_url, app=review_app(Counters()))
    try:
        uncrashed = Kit(clean).run_to_end("review", {"topic": "tides"}, decide="approve").result
    finally:
        clean.close()
    rt = make_runtime(db_url, app=review_app(Counters()), lease_seconds=1.5)
    log, hang = tmp_path / "nodes.txt", tmp_path / "hang"
    hang.touch()
    env = {"STEPTRAIL_APP": APP, "STEPTRAIL_LEASE_SECONDS": "1.5", "REVIEW_LOG": str(log)}
    procs: list[Any] = []
    try:
        run_id = rt.enqueue("review", {"topic": "tides"})
        procs.append(spawn_worker(db_url, log=tmp_path / "w1.log", REVIEW_HANG=str(hang), **env))
        assert wait_until(lambda: log.exists() and "review" in log.read_text(), 60)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        hang.unlink()
        recorded = [h.event for h in rt.history(run_id) if isinstance(h.event, Run.StepRecorded)]
        assert [s.name for s in recorded] == ["research", "draft"]
        reaper = rt.reaper()
        assert wait_until(lambda: reaper.reap_once(10).requeued == 1, 30, step=0.2)
        procs.append(spawn_worker(db_url, "--burst", log=tmp_path / "w2.log", **env))
        assert procs[1].wait(60) == 0
        assert rt.get(run_id).status is RunStatus.WAITING_FOR_APPROVAL
        digest = rt.pending(run_id).digest
        refused = steptrail(
            "approve", str(run_id), "--by", "mallory", "--digest", "sha256:" + "0" * 64,
            url=db_url, STEPTRAIL_APP=APP,
        )  # fmt: skip
        assert refused.returncode != 0
        approved = steptrail(
            "approve", str(run_id), "--by", "alice", "--digest", digest, "--resume", "queue",
            url=db_url, STEPTRAIL_APP=APP,
        )  # fmt: skip
        assert approved.returncode == 0, approved.stderr
        procs.append(spawn_worker(db_url, "--burst", log=tmp_path / "w3.log", **env))
        assert procs[2].wait(60) == 0
        row = rt.get(run_id)
        assert row.status is RunStatus.COMPLETED
        runs = Counter(log.read_text().split())
        # research and draft were recorded before the kill: executed once; review ran when
        # killed, again to interrupt, again with the answer; publish (the write) once.
        assert runs == Counter({"research": 1, "draft": 1, "review": 3, "publish": 1})
        (done,) = [h.event for h in rt.history(run_id) if isinstance(h.event, Run.Completed)]
        assert _without_ids(done.result["result"]) == _without_ids(uncrashed)
    finally:
        stop(procs)
        rt.close()


def _without_ids(state: dict[str, Any]) -> dict[str, Any]:
    messages = [{k: v for k, v in m.items() if k != "id"} for m in state["messages"]]
    return {**state, "messages": messages}
