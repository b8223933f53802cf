"""Prometheus metrics, read from the views and the run index.

Metrics are one more projection of the log: nothing is counted in a worker's memory, so
every process exposing them agrees, and a restart loses nothing.

A scrape only reads (ADR 0021): the served endpoint never folds the log itself (the workers'
projection runner, or `steptrail project --every`, keeps the views current), and it answers
from a snapshot at most `cache_s` old, so a burst of scrapes costs one set of reads. The HTTP
server queues up to `BACKLOG` connections and serves at most `max_threads` at once; further
ones wait in the listen queue rather than each getting a thread.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import HTTPServer
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector, CollectorRegistry

from steptrail.runtime import Runtime

BACKLOG = 128
MAX_THREADS = 8
CLIENT_TIMEOUT_S = 10.0


class RunsCollector(Collector):
    """Collects run counts, the oldest queued run's age and expired leases.

    Args:
        cache_s: reuse a snapshot younger than this many seconds (0: read at every call).
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        cache_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runtime = runtime
        self.cache_s = cache_s
        self.clock = clock
        self.reads = 0
        self._lock = threading.Lock()
        self._snapshot: tuple[float, list[GaugeMetricFamily]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            now = self.clock()
            if self._snapshot is None or now - self._snapshot[0] >= self.cache_s:
                self._snapshot = (now, self._read())
            families = self._snapshot[1]
        yield from families

    def _read(self) -> list[GaugeMetricFamily]:
        self.reads += 1
        views = self.runtime.views
        by_status = GaugeMetricFamily(
            "steptrail_runs", "Runs by agent and status.", labels=["agent", "status"]
        )
        for (agent, status), count in views.status_counts().items():
            by_status.add_metric([agent, status], count)
        by_reason = GaugeMetricFamily(
            "steptrail_runs_ended",
            "Ended runs by status and termination reason (dead letters are failed with "
            "retries_exhausted or not_retryable).",
            labels=["status", "reason"],
        )
        for (status, reason), count in views.reason_counts().items():
            by_reason.add_metric([status, reason], count)
        health = views.health()
        age = 0.0
        if health.oldest_queued_at is not None:
            age = max(0.0, (health.now - health.oldest_queued_at).total_seconds())
        return [
            by_status,
            by_reason,
            GaugeMetricFamily(
                "steptrail_oldest_queued_age_seconds",
                "How long the run that has waited longest on the queue has waited (0: none).",
                value=age,
            ),
            GaugeMetricFamily(
                "steptrail_view_failed_batches",
                "Reporting-view batches that failed in a row (0: the views are keeping up).",
                value=views.runner().failures,
            ),
            GaugeMetricFamily(
                "steptrail_stale_leases",
                "Running runs whose lease expired and that the reaper has not handled yet.",
                value=health.stale_leases,
            ),
            *self._projections(),
        ]

    def _projections(self) -> list[GaugeMetricFamily]:
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
        return [lag, failed]


def registry_for(runtime: Runtime, *, cache_s: float = 0.0) -> CollectorRegistry:
    """A registry holding only steptrail's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsCollector(runtime, cache_s=cache_s))
    return registry


class MetricsServer(HTTPServer):
    """An HTTP server with a deep listen queue and a bounded number of handler threads."""

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(
        self, host: str, port: int, registry: CollectorRegistry, *, max_threads: int
    ) -> None:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        self.address_family = infos[0][0]
        self._slots = threading.BoundedSemaphore(max_threads)

        class Handler(MetricsHandler.factory(registry)):  # type: ignore[misc]
            timeout = CLIENT_TIMEOUT_S

            def log_message(self, format: str, *args: Any) -> None:
                return  # scrapes are not worth a log line each

        super().__init__((host, port), Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Blocks the accept loop while every slot is busy: waiting connections stay in the
        # kernel's listen queue (BACKLOG deep) instead of each costing a thread.
        self._slots.acquire()
        thread = threading.Thread(target=self._handle, args=(request, client_address), daemon=True)
        thread.start()

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - one broken client must not stop the server
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()


def serve(
    runtime: Runtime,
    host: str,
    port: int,
    *,
    cache_s: float = 1.0,
    max_threads: int = MAX_THREADS,
) -> tuple[MetricsServer, threading.Thread]:
    """Serve `/metrics` in a background thread; stop with `server.shutdown()`.

    Raises:
        OSError: the address cannot be listened on (in use, unknown host, not permitted).
    """
    server = MetricsServer(
        host, port, registry_for(runtime, cache_s=cache_s), max_threads=max_threads
    )
    thread = threading.Thread(target=server.serve_forever, name="steptrail-metrics", daemon=True)
    thread.start()
    return server, thread
