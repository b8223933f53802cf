"""Worker metrics, scraped over HTTP from a worker while it works a burst (both backends)."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from steptrail import RunStatus, Settings, open_runtime
from steptrail.runtime import Runtime
from steptrail.worker_metrics import METRIC_NAMES, WorkerMetrics, serve_metrics
from tests.conftest import make_runtime


def scrape(port: int) -> dict[str, float]:
    """Each family's movement figure: the count of a histogram, the total of a counter, the
    value of a gauge (summed over labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    figures = dict.fromkeys(METRIC_NAMES, 0.0)
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        if name not in figures:
            continue  # the `_created` timestamps of counters and histograms
        for sample in family.samples:
            if family.type == "histogram" and not sample.name.endswith("_count"):
                continue
            if family.type == "counter" and not sample.name.endswith("_total"):
                continue
            figures[name] = figures.get(name, 0.0) + sample.value
    return figures


def wait_until(check: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_metrics__every_worker_metric_moves_during_a_burst(db_url: str) -> None:
    """A scrape before and scrapes during a burst (plain runs, a retried run that replays,
    a long step whose lease is renewed, a run cancelled mid-step) see every metric move, and
    runs in flight while they run."""
    rt: Runtime = make_runtime(db_url, lease_seconds=0.9, retry_base_seconds=0.05)
    assert rt.metrics is not None
    server = serve_metrics(rt.metrics.registry, 0, "127.0.0.1")
    try:
        before = scrape(server.port)
        assert not any(before.values())
        plain = [rt.enqueue("scripted", {"steps": 2, "sleep": 0.02}) for _ in range(20)]
        retried = rt.enqueue(
            "scripted", {"steps": 3, "fail": {"class": "server_error", "at": 2, "times": 1}}
        )
        renewed = rt.enqueue("scripted", {"steps": 1, "sleep": 0.8})
        cancelled = rt.enqueue("scripted", {"steps": 40, "sleep": 0.1})
        worker = rt.worker(concurrency=4)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        wait_until(lambda: rt.get(cancelled).status is RunStatus.RUNNING)
        rt.cancel(cancelled, by="test")
        during = []
        done = [*plain, retried, renewed]
        while not all(rt.get(r).status is RunStatus.COMPLETED for r in done):
            during.append(scrape(server.port))
            time.sleep(0.05)
        wait_until(lambda: scrape(server.port)["steptrail_worker_leases_lost_total"] > 0)
        after = scrape(server.port)
        worker.stop()
        thread.join(30)
    finally:
        server.close()
        rt.close()
    assert max(d["steptrail_worker_runs_in_flight"] for d in during) > 0
    assert after["steptrail_worker_runs_in_flight"] == 0
    moved = {name for name in METRIC_NAMES if after[name] > before[name]}
    assert moved == set(METRIC_NAMES) - {"steptrail_worker_runs_in_flight"}


def test_metrics__labels_say_what_happened(db_url: str) -> None:
    """Outcomes, retries, replays, lost leases and step durations carry the labels that say
    which agent, class, kind, cause and step."""
    rt = make_runtime(db_url, lease_seconds=2.0)
    metrics = rt.metrics
    assert isinstance(metrics, WorkerMetrics)
    try:
        rt.enqueue("scripted", {"steps": 3, "fail": {"class": "rate_limit", "at": 3, "times": 1}})
        rt.enqueue("scripted", {"steps": 1, "fail": {"class": "auth", "at": 1}})
        # The retry waits out its backoff on the queue; burst workers leave it there.
        wait_until(lambda: not (rt.work(concurrency=2, burst=True) and rt.runs(status="queued")))
    finally:
        rt.close()

    def value(metric: str, **labels: str) -> float:
        found = metrics.registry.get_sample_value(metric, labels)
        return found or 0.0

    assert value("steptrail_worker_retries_total", failure_class="rate_limit") == 1
    assert value("steptrail_worker_segments_total", agent="scripted", outcome="requeued") == 1
    assert value("steptrail_worker_segments_total", agent="scripted", outcome="completed") == 1
    assert value("steptrail_worker_segments_total", agent="scripted", outcome="failed") == 1
    assert value("steptrail_worker_steps_replayed_total", kind="llm") == 2
    assert value("steptrail_worker_queue_wait_seconds_count", agent="scripted") == 2
    assert value("steptrail_worker_runs_claimed_total", agent="scripted") == 3
    assert (
        value(
            "steptrail_worker_step_duration_seconds_count",
            kind="llm",
            name="think-3",
            outcome="error",
        )
        == 1
    )
    assert value("steptrail_worker_claim_duration_seconds_count", result="runs") >= 2


def test_metrics__go_to_the_registry_an_embedder_passes(sqlite_url: str) -> None:
    """`steptrail.open(..., metrics_registry=R)` registers the worker metrics in R, where the
    application's own exposition finds them."""
    registry = CollectorRegistry()
    settings = Settings(database_url=sqlite_url, log_level="warning")
    rt = open_runtime(settings=settings, metrics_registry=registry)
    try:
        assert rt.metrics is not None
        assert rt.metrics.registry is registry
        rt.enqueue("scripted", {"steps": 1})
        rt.work(burst=True)
    finally:
        rt.close()
    text = generate_latest(registry).decode()
    assert 'steptrail_worker_segments_total{agent="scripted",outcome="completed"} 1.0' in text
