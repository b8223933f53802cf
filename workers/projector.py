"""The projection runner: keeps the reporting views and your projections up with the log.

The exactly-once work happens in the store's `process_batch` (view changes and tracking
position commit together); this is only the loop around it. Several runners may run at once
(every worker process starts one): they take turns on each tracking row.

A batch that fails for any other reason than a store outage (a poison batch: an event the
folds reject) must not end the loop silently, as it once did inside `steptrail work`: it is
logged as an error, counted where operators look (`steptrail stats`, metrics), and tried
again with a growing pause, so a fix (a migration, a new release) lets it through (ADR 0017).

Each user projection has its own tracking row, so one that raises stops only itself: its
batch rolls back, the failure is recorded where `stats` and the metrics read it, and this
runner leaves it alone for a while (doubling, up to `MAX_BACKOFF_S`) before trying the same
batch again — once the projection's code is fixed and the process restarted, it resumes
from that position (ADR 0030). The views and the projections are tried separately: neither
one's trouble holds the other back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from steptrail.domain.errors import StoreUnavailable, UnreadableEvent
from steptrail.projections.custom import ProjectionFailed

if TYPE_CHECKING:
    import structlog


class Views(Protocol):
    def process_batch(self, limit: int = 1000) -> tuple[int, tuple[int, int]]: ...
    def record_failure(self, error: str) -> None: ...


MAX_PAUSE_S = 60.0
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


class Tracked(Protocol):
    """A user projection's store: a named tracked batch."""

    @property
    def name(self) -> str: ...
    def process_batch(self, limit: int = 1000) -> tuple[int, tuple[int, int]]: ...


class Isolated:
    """Runs one user projection's batches, parking it after a failure (see the module
    docstring). `clock` is injectable for tests."""

    def __init__(
        self,
        store: Tracked,
        *,
        log: structlog.typing.FilteringBoundLogger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.log = log
        self.clock = clock
        self.failures = 0
        self.parked_until = 0.0

    @property
    def name(self) -> str:
        return self.store.name

    def process_batch(self, limit: int) -> tuple[int, tuple[int, int]] | None:
        """One batch; None when the projection is parked or has just failed."""
        if self.failures and self.clock() < self.parked_until:
            return None
        try:
            result = self.store.process_batch(limit)
        except ProjectionFailed as failed:
            self.failures += 1
            backoff = min(FIRST_BACKOFF_S * 2 ** (self.failures - 1), MAX_BACKOFF_S)
            self.parked_until = self.clock() + backoff
            self.log.warning(
                "projection_failed",
                projection=self.name,
                position=failed.failure.position,
                run_id=str(failed.failure.run_id),
                topic=failed.failure.topic,
                error=failed.failure.error[:200],
                retry_in_s=backoff,
            )
            return None
        if self.failures:
            self.log.info("projection_resumed", projection=self.name, position=result[1])
            self.failures = 0
        return result


class Projector:
    """Runs `process_batch` until stopped, sleeping only when it has caught up."""

    def __init__(
        self,
        views: Views,
        *,
        batch: int = 1000,
        log: structlog.typing.FilteringBoundLogger | None = None,
        projections: Sequence[Tracked] = (),
    ) -> None:
        self.views = views
        self.batch = batch
        if log is None:
            import structlog

            log = structlog.get_logger()
        self.log = log
        self.projections = [Isolated(p, log=self.log) for p in projections]

    def run_once(self) -> int:
        """One batch; returns the number of events folded."""
        consumed, position = self.views.process_batch(self.batch)
        if consumed:
            self.log.debug("views_projected", events=consumed, position=position)
        return consumed

    def run_projections_once(self) -> bool:
        """One batch of every user projection that is not parked; True if any of them has
        more to do right away."""
        busy = False
        for projection in self.projections:
            result = projection.process_batch(self.batch)
            if result is None:
                continue
            consumed, position = result
            if consumed:
                self.log.debug(
                    "projection_projected",
                    projection=projection.name,
                    events=consumed,
                    position=position,
                )
            busy = busy or consumed >= self.batch
        return busy

    def run_forever(self, interval: float, stop: threading.Event) -> None:
        """Project until `stop` is set; a store outage is logged and retried, a poison batch
        of the views is logged, recorded and retried after a growing pause (the projections
        go on meanwhile), a failing projection is parked (`Isolated`)."""
        failures = 0
        views_due = 0.0
        while not stop.is_set():
            consumed = 0
            if time.monotonic() >= views_due:
                try:
                    consumed = self.run_once()
                    failures = 0
                except StoreUnavailable as error:
                    self.log.warning("projection_failed", error=str(error)[:200])
                except UnreadableEvent as error:
                    # The views stop at the event before it (nothing is skipped) and the
                    # runner keeps trying; the worker around it carries on (ADR 0019).
                    # Recorded like any poison batch, so operators see it (ADR 0017).
                    self.log.error(  # noqa: TRY400 - the message names the row; a traceback adds nothing
                        "projection_stalled", error=str(error)[:300]
                    )
                    failures += 1
                    self._record(error)
                    views_due = time.monotonic() + min(MAX_PAUSE_S, interval * 2**failures)
                except Exception as error:  # noqa: BLE001 - a poison batch must not end the runner
                    failures += 1
                    self.failed(error, failures)
                    views_due = time.monotonic() + min(MAX_PAUSE_S, interval * 2**failures)
            busy = False
            try:
                busy = self.run_projections_once()
            except StoreUnavailable as error:
                self.log.warning("projection_failed", error=str(error)[:200])
            if consumed < self.batch and not busy:
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
