"""The tutorial's shell session runs as written, as a reader would run it: a worker killed
mid-step, reaped, replayed, approved and completed, with each model call and the write made
once (docs/tutorial.md shows examples/tutorial/session.sh section by section)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SESSION = REPO / "examples" / "tutorial" / "session.sh"

pytestmark = pytest.mark.slow  # a worker process SIGKILLed, leases waited out: about 20 s


def test_tutorial_session__crash_reap_replay_approve_complete(tmp_path: Path) -> None:
    """Every command of the session succeeds; the trail has the reclaim, the replay, the
    decision and the completion; research and the reply ran once each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env |= {
        "PYTHONPATH": str(REPO),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "STEPTRAIL_LOG_LEVEL": "warning",
        "COLUMNS": "200",
    }
    done = subprocess.run(
        ["bash", str(SESSION)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Reaped 1 stale run(s): 1 requeued, 0 dead-lettered, 0 skipped" in output, output
    final = done.stdout.rsplit("Claimed", 1)[-1]
    for event in ("Replayed", "EffectPending", "Completed"):
        assert event in final, done.stdout
    for event in ("Reclaimed", "Suspended", "Decided", "Released"):
        assert event in done.stdout
    calls = (tmp_path / "model-calls.log").read_text().splitlines()
    assert calls[0] == "research", calls
    assert len(calls) == 2, calls
    assert (tmp_path / "outbox.txt").read_text().count("\n") == 1
