"""Worker metrics: what the workers of this process did, as Prometheus histograms and counters.

These are counted in memory by the process that does the work (claim latency, step durations,
lease renewals and losses, outcomes, retries), which the log cannot tell: a claim's round trip
or a step's wall time are never recorded as events. They sit beside the view-based gauges of
`steptrail metrics` (`steptrail.metrics`), which count runs from the log and agree across
processes; these are per process, and Prometheus sums them over the workers it scrapes.

`steptrail work --metrics-port P` serves them; an embedder reads `Runtime.metrics.registry`
or hands its own registry to `steptrail.open(..., metrics_registry=...)` (ADR 0032).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from prometheus_client.registry import CollectorRegistry

from steptrail.domain.enums import Outcome
from steptrail.domain.ports import ClaimedRun
from steptrail.domain.run import Run
from steptrail.workers.telemetry import (
    SegmentProbe,
    StepEnd,
    StepProbe,
    Telemetry,
)

__all__ = ["METRIC_NAMES", "MetricsServer", "WorkerMetrics", "serve_metrics"]

# A claim is one round trip to the database: milliseconds, a second when it is in trouble.
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Steps range from a local function (sub-millisecond) to a long model call or tool (minutes).
STEP_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
# Queue wait: from an idle queue (milliseconds) to a backlog of an hour.
WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

# Every family this module exports, as Prometheus names it (histograms add _bucket, _sum,
# _count; counters add _total). The Grafana dashboard's test checks its queries against these.
METRIC_NAMES = (
    "steptrail_worker_claim_duration_seconds",
    "steptrail_worker_runs_claimed_total",
    "steptrail_worker_queue_wait_seconds",
    "steptrail_worker_step_duration_seconds",
    "steptrail_worker_steps_replayed_total",
    "steptrail_worker_lease_renewals_total",
    "steptrail_worker_leases_lost_total",
    "steptrail_worker_segments_total",
    "steptrail_worker_retries_total",
    "steptrail_worker_runs_in_flight",
)


class WorkerMetrics(Telemetry):
    """The worker metrics of one runtime, registered in `registry` (a private one by default).

    Args:
        registry: where to register the metrics; pass `prometheus_client.REGISTRY` to serve
            them with your application's own. Two runtimes must not share one registry.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.claim_duration = Histogram(
            "steptrail_worker_claim_duration_seconds",
            "Round trip of one claim (one statement claiming up to the free slots), "
            "by whether it returned runs.",
            ["result"],
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.runs_claimed = Counter(
            "steptrail_worker_runs_claimed",
            "Runs claimed from the queue, by agent.",
            ["agent"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "steptrail_worker_queue_wait_seconds",
            "From enqueue to first claim, by the database's clock, by agent.",
            ["agent"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.step_duration = Histogram(
            "steptrail_worker_step_duration_seconds",
            "Wall time of live (not replayed) steps, by kind, name and outcome (ok or error).",
            ["kind", "name", "outcome"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.replayed = Counter(
            "steptrail_worker_steps_replayed",
            "Step calls answered from the journal instead of run again, by kind.",
            ["kind"],
            registry=r,
        )
        self.renewals = Counter(
            "steptrail_worker_lease_renewals",
            "LeaseRenewed appends confirmed (long steps and idle stretches; every step "
            "append also renews the lease, those are not counted here).",
            registry=r,
        )
        self.lost = Counter(
            "steptrail_worker_leases_lost",
            "Segments that learned they no longer own their run (a fencing conflict), by "
            "cause: taken_over (reclaimed or claimed by another), cancelled, self_fenced "
            "(store unreachable for half a lease), gone (purged).",
            ["cause"],
            registry=r,
        )
        self.segments = Counter(
            "steptrail_worker_segments",
            "Segments ended, by agent and outcome (completed, requeued, failed, "
            "awaiting_approval, lease_lost, …; crashed when steptrail itself failed).",
            ["agent", "outcome"],
            registry=r,
        )
        self.retries = Counter(
            "steptrail_worker_retries",
            "Runs sent back to the queue by the retry ladder, by failure class.",
            ["failure_class"],
            registry=r,
        )
        self.in_flight = Gauge(
            "steptrail_worker_runs_in_flight",
            "Segments executing in this process now.",
            registry=r,
        )
        # Child lookups by label values cost a lock and a dict probe; cache the hot ones.
        self._claim_hit = self.claim_duration.labels("runs")
        self._claim_empty = self.claim_duration.labels("empty")
        self._steps: dict[tuple[str, str, str], Histogram] = {}
        self._children: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()

    # -- Telemetry -------------------------------------------------------------------------------

    def claimed(self, runs: Sequence[ClaimedRun], seconds: float) -> None:
        (self._claim_hit if runs else self._claim_empty).observe(seconds)
        for item in runs:
            state = item.run.state
            self.child(self.runs_claimed, state.agent).inc()
            # Version 2 is Queued then this Claimed: the first claim (retries, reclaims and
            # released decisions come later and are not "enqueue to first claim").
            if item.age_s is not None and state.version == 2:
                self.child(self.queue_wait, state.agent).observe(item.age_s)

    def segment_started(self, run: Run) -> SegmentProbe:
        self.in_flight.inc()
        return _SegmentMetrics(self, run.state.agent)

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: the lookup costs a lock and label checks, and
        these are called for every claim and segment (ADR 0045)."""
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            with self._lock:
                found = self._children.setdefault(key, metric.labels(*labels))
        return found

    def step_histogram(self, kind: str, name: str, outcome: str) -> Histogram:
        key = (kind, name, outcome)
        child = self._steps.get(key)
        if child is None:
            with self._lock:
                child = self._steps.setdefault(key, self.step_duration.labels(*key))
        return child


class _StepMetrics(StepProbe):
    def __init__(self, metrics: WorkerMetrics, kind: str, name: str) -> None:
        self.metrics = metrics
        self.kind = kind
        self.name = name
        self.started = time.perf_counter()

    def ended(self, end: StepEnd) -> None:
        outcome = "ok" if end.error_type is None else "error"
        elapsed = time.perf_counter() - self.started
        self.metrics.step_histogram(self.kind, self.name, outcome).observe(elapsed)


class _SegmentMetrics(SegmentProbe):
    def __init__(self, metrics: WorkerMetrics, agent: str) -> None:
        self.metrics = metrics
        self.agent = agent
        self.failure_class: str | None = None

    def step_started(self, kind: str, name: str, seq: int) -> StepProbe:
        return _StepMetrics(self.metrics, kind, name)

    def step_replayed(self, kind: str, name: str, seq: int, *, failed: bool) -> None:
        self.metrics.replayed.labels(kind).inc()

    def lease_renewed(self) -> None:
        self.metrics.renewals.inc()

    def lease_lost(self, cause: str) -> None:
        self.metrics.lost.labels(cause).inc()

    def failed(self, failure_class: str, error_type: str) -> None:
        self.failure_class = failure_class

    def ended(self, outcome: Outcome | None) -> None:
        m = self.metrics
        m.in_flight.dec()
        m.child(m.segments, self.agent, outcome.value if outcome else "crashed").inc()
        if outcome is Outcome.REQUEUED and self.failure_class is not None:
            m.retries.labels(self.failure_class).inc()


class MetricsServer:
    """A running `/metrics` HTTP endpoint; `close()` stops it."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str) -> None:
        self._server, self._thread = start_http_server(port, addr=addr, registry=registry)

    @property
    def port(self) -> int:
        """The port it listens on (the one the OS chose when asked for port 0)."""
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> MetricsServer:  # noqa: S104 - scraped from other hosts
    """Serve `registry` for Prometheus at `http://addr:port/metrics` on a daemon thread.

    Raises:
        OSError: the port is taken or the address is not this machine's.
    """
    return MetricsServer(registry, port, addr)
