"""`steptrail console` as an operator starts it: safe binds, and a page served."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("uvicorn", reason="the console extra is not installed")

from tests.acceptance.helpers import REPO, env_for, steptrail


def test_console__public_bind_without_token_refuses_to_start(sqlite_url: str) -> None:
    """`--host 0.0.0.0` without STEPTRAIL_CONSOLE_TOKEN exits 2 at once, serving nothing."""
    done = steptrail("console", "--host", "0.0.0.0", "--port", "1", url=sqlite_url, timeout=30)
    assert done.returncode == 2
    assert "STEPTRAIL_CONSOLE_TOKEN" in done.stderr
    short = steptrail(
        "console",
        "--host",
        "0.0.0.0",
        url=sqlite_url,
        timeout=30,
        STEPTRAIL_CONSOLE_TOKEN="short",
    )
    assert short.returncode == 2
    assert "16 characters" in short.stderr


def test_console__serves_on_loopback_until_stopped(sqlite_url: str) -> None:
    """Started on 127.0.0.1, the console answers with the runs page; SIGTERM stops it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "steptrail", "console", "--port", str(port)],
        cwd=REPO,
        env=env_for(sqlite_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/runs", timeout=5) as r:
                    body = r.read().decode()
                    break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.2)
        assert "No runs match." in body
    finally:
        proc.terminate()
        proc.wait(timeout=30)
