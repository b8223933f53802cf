"""The lease keeper: one thread per process that renews the leases of long steps.

A step that runs longer than a third of the lease gets a `LeaseRenewed` appended for it in
the background, so a slow model call does not look like a dead worker. One shared thread
(rather than a timer per step) keeps a short step free of any thread start-up cost.

Because that one thread renews for every run of the process, nothing may end it: an error
renewing one segment is logged and the loop goes on (the segment's own boundary checks still
fence it), and a thread that died anyway is started again at the next `track`.
"""

from __future__ import annotations

import threading

import structlog

from steptrail.workers.segment import Segment


class LeaseKeeper:
    """Renews due leases of the segments it tracks, every `tick` seconds, until closed."""

    def __init__(
        self, lease_s: float, *, log: structlog.typing.FilteringBoundLogger | None = None
    ) -> None:
        self.tick = max(0.05, min(1.0, lease_s / 6))
        self.log = log or structlog.get_logger()
        self.failures = 0
        self._segments: set[Segment] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, segment: Segment) -> None:
        with self._lock:
            self._segments.add(segment)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="steptrail-lease-keeper", daemon=True
                )
                self._thread.start()

    def untrack(self, segment: Segment) -> None:
        with self._lock:
            self._segments.discard(segment)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.tick):
            with self._lock:
                due = list(self._segments)
            for segment in due:
                self._renew(segment)

    def _renew(self, segment: Segment) -> None:
        try:
            segment.try_renew()
        except Exception as error:  # one segment's bug must not stop renewal for all
            self.failures += 1
            self.log.error(
                "lease_renewal_failed",
                run_id=str(segment.run.id),
                error_type=type(error).__name__,
                exc_info=True,
            )
