"""The projection runner: keeps the reporting views up with the log, batch by batch.

The exactly-once work happens in the store's `process_batch` (view changes and tracking
position commit together); this is only the loop around it. Several runners may run at once
(every worker process starts one): they take turns on the tracking row.
"""

from __future__ import annotations

import threading
from typing import Protocol

import structlog

from steptrail.domain.errors import StoreUnavailable, UnreadableEvent


class Views(Protocol):
    def process_batch(self, limit: int = 1000) -> tuple[int, tuple[int, int]]: ...


class Projector:
    """Runs `process_batch` until stopped, sleeping only when it has caught up."""

    def __init__(
        self,
        views: Views,
        *,
        batch: int = 1000,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.views = views
        self.batch = batch
        self.log = log or structlog.get_logger()

    def run_once(self) -> int:
        """One batch; returns the number of events folded."""
        consumed, position = self.views.process_batch(self.batch)
        if consumed:
            self.log.debug("views_projected", events=consumed, position=position)
        return consumed

    def run_forever(self, interval: float, stop: threading.Event) -> None:
        """Project until `stop` is set; a store outage is logged and retried."""
        while not stop.is_set():
            try:
                consumed = self.run_once()
            except StoreUnavailable as error:
                self.log.warning("projection_failed", error=str(error)[:200])
                consumed = 0
            except UnreadableEvent as error:
                # The views stop at the event before it (nothing is skipped) and the runner
                # keeps trying; the worker around it carries on (ADR 0019).
                self.log.error(  # noqa: TRY400 - the message names the row; a traceback adds nothing
                    "projection_stalled", error=str(error)[:300]
                )
                consumed = 0
            if consumed < self.batch:
                stop.wait(interval)
