"""Prometheus metrics, read from the views and the run index at every scrape.

Metrics are one more projection of the log: nothing is counted in a worker's memory, so
every process exposing them agrees, and a restart loses nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from steptrail.runtime import Runtime


class RunsCollector(Collector):
    """Collects run counts, the oldest queued run's age and expired leases on each scrape."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.runtime.project()
        views = self.runtime.views
        by_status = GaugeMetricFamily(
            "steptrail_runs", "Runs by agent and status.", labels=["agent", "status"]
        )
        for (agent, status), count in views.status_counts().items():
            by_status.add_metric([agent, status], count)
        yield by_status
        by_reason = GaugeMetricFamily(
            "steptrail_runs_ended",
            "Ended runs by status and termination reason (dead letters are failed with "
            "retries_exhausted or not_retryable).",
            labels=["status", "reason"],
        )
        for (status, reason), count in views.reason_counts().items():
            by_reason.add_metric([status, reason], count)
        yield by_reason
        health = views.health()
        age = 0.0
        if health.oldest_queued_at is not None:
            age = max(0.0, (health.now - health.oldest_queued_at).total_seconds())
        yield GaugeMetricFamily(
            "steptrail_oldest_queued_age_seconds",
            "How long the run that has waited longest on the queue has waited (0: none).",
            value=age,
        )
        yield GaugeMetricFamily(
            "steptrail_stale_leases",
            "Running runs whose lease expired and that the reaper has not handled yet.",
            value=health.stale_leases,
        )
        yield from self._projections()

    def _projections(self) -> Iterator[GaugeMetricFamily]:
        """Lag and failure of every tracked projection: the reporting views and the app's."""
        lag = GaugeMetricFamily(
            "steptrail_projection_lag_events",
            "Events of the log a projection has not folded yet.",
            labels=["projection"],
        )
        failed = GaugeMetricFamily(
            "steptrail_projection_failed",
            "1 while a projection is stopped by an error (see `steptrail stats`), else 0.",
            labels=["projection", "error_type"],
        )
        for status in self.runtime.tracked():
            lag.add_metric([status.name], status.lag)
            error_type = status.failure.error.partition(":")[0] if status.failure else ""
            failed.add_metric([status.name, error_type], 1 if status.failure else 0)
        yield lag
        yield failed


def registry_for(runtime: Runtime) -> CollectorRegistry:
    """A registry holding only steptrail's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsCollector(runtime))
    return registry
