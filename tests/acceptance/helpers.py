"""Driving the `steptrail` command as a subprocess, as an operator would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FAST_ENV = {
    "STEPTRAIL_LEASE_SECONDS": "2",
    "STEPTRAIL_RETRY_BASE_SECONDS": "0.05",
    "STEPTRAIL_RETRY_CAP_SECONDS": "0.2",
    "STEPTRAIL_POLL_INTERVAL": "0.05",
    "STEPTRAIL_LOG_FORMAT": "json",
    "STEPTRAIL_LOG_LEVEL": "info",
}


def env_for(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env.update(FAST_ENV)
    env["STEPTRAIL_DATABASE_URL"] = url
    env["STEPTRAIL_APP"] = "tests.acceptance.agents:app"
    env.update(extra)
    return env


def steptrail(
    *args: str, url: str, timeout: float = 60, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run `python -m steptrail ARGS` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "steptrail", *args],
        cwd=REPO,
        env=env_for(url, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def spawn_worker(url: str, *args: str, log: Path, **extra: str) -> subprocess.Popen[Any]:
    """Start `steptrail work ARGS` in the background, its JSON log going to `log`."""
    handle = log.open("a")
    return subprocess.Popen(
        [sys.executable, "-m", "steptrail", "work", *args],
        cwd=REPO,
        env=env_for(url, **extra),
        stdout=handle,
        stderr=handle,
    )


def replace_worker(
    procs: list[subprocess.Popen[Any]],
    logs: list[Path],
    victim: int,
    url: str,
    log: Path,
    **extra: str,
) -> None:
    """SIGKILL worker `victim` and start another in its place, logging to `log`."""
    procs[victim].send_signal(signal.SIGKILL)
    procs[victim].wait()
    logs[victim] = log
    procs[victim] = spawn_worker(url, "--concurrency", "4", log=log, **extra)
