"""`steptrail work --metrics-port`: an operator's worker serves its metrics while it works."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.acceptance.helpers import spawn_worker, steptrail


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_work__serves_worker_metrics_while_working(sqlite_url: str, tmp_path: Path) -> None:
    """A burst worker started with --metrics-port answers /metrics with its worker metrics
    (and the process's own) while it runs, and shows the claims and steps it made."""
    for _ in range(3):
        enqueued = steptrail(
            "enqueue", "scripted", "-r", '{"steps": 4, "sleep": 0.4}', url=sqlite_url
        )
        assert enqueued.returncode == 0, enqueued.stderr
    port = free_port()
    worker = spawn_worker(
        sqlite_url,
        "--burst",
        "--concurrency",
        "3",
        "--metrics-port",
        str(port),
        "--metrics-addr",
        "127.0.0.1",
        log=tmp_path / "worker.log",
    )
    seen: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and worker.poll() is None:
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as response:
                    text = response.read().decode()
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
                continue
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    seen[sample.name] = max(seen.get(sample.name, 0.0), sample.value)
            if seen.get("steptrail_worker_step_duration_seconds_count", 0) >= 2:
                break
            time.sleep(0.1)
        assert worker.wait(60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert seen["steptrail_worker_runs_in_flight"] >= 1
    assert seen["steptrail_worker_claim_duration_seconds_count"] >= 1
    assert seen["steptrail_worker_step_duration_seconds_count"] >= 2
    assert seen["steptrail_worker_queue_wait_seconds_count"] >= 1
    assert "process_cpu_seconds_total" in seen
