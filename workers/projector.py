"""The projection runner: keeps the reporting views up with the log, batch by batch.

The exactly-once work happens in the store's `process_batch` (view changes and tracking
position commit together); this is only the loop around it. Several runners may run at once
(every worker process starts one): they take turns on the tracking row.

A batch that fails for any other reason than a store outage (a poison batch: an event the
folds reject) must not end the loop silently, as it once did inside `steptrail work`: it is
logged as an error, counted where operators look (`steptrail stats`, metrics), and tried
again with a growing pause, so a fix (a migration, a new release) lets it through (ADR 0017).
"""

from __future__ import annotations

import threading
from typing import Protocol

import structlog

from steptrail.domain.errors import StoreUnavailable, UnreadableEvent


class Views(Protocol):
    def process_batch(self, limit: int = 1000) -> tuple[int, tuple[int, int]]: ...
    def record_failure(self, error: str) -> None: ...


MAX_PAUSE_S = 60.0


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
        """Project until `stop` is set; a store outage is logged and retried, a poison batch
        is logged, recorded and retried after a growing pause."""
        failures = 0
        while not stop.is_set():
            try:
                consumed = self.run_once()
            except StoreUnavailable as error:
                self.log.warning("projection_failed", error=str(error)[:200])
                consumed = 0
            except UnreadableEvent as error:
                # The views stop at the event before it (nothing is skipped) and the runner
                # keeps trying; the worker around it carries on (ADR 0019). Recorded like any
                # poison batch, so operators see it (ADR 0017).
                self.log.error(  # noqa: TRY400 - the message names the row; a traceback adds nothing
                    "projection_stalled", error=str(error)[:300]
                )
                failures += 1
                self._record(error)
                stop.wait(min(MAX_PAUSE_S, interval * 2**failures))
                continue
            except Exception as error:  # noqa: BLE001 - a poison batch must not end the runner
                failures += 1
                self.failed(error, failures)
                stop.wait(min(MAX_PAUSE_S, interval * 2**failures))
                continue
            failures = 0
            if consumed < self.batch:
                stop.wait(interval)

    def failed(self, error: Exception, in_a_row: int) -> None:
        """Log and record a batch that failed for another reason than an outage."""
        self.log.error(
            "projection_batch_failed",
            error=_describe(error)[:200],
            failures=in_a_row,
            exc_info=True,
        )
        self._record(error)

    def _record(self, error: Exception) -> None:
        try:
            self.views.record_failure(_describe(error))
        except Exception as unrecorded:  # noqa: BLE001 - the store may be why; the log stands
            self.log.warning("projection_failure_unrecorded", error_type=type(unrecorded).__name__)


def _describe(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"
