"""The projection runner: keeps the reporting views and your projections up with the log.

The exactly-once work happens in each store's `process_batch` (view changes and tracking
position commit together); this is only the loop around it. Several runners may run at once
(every worker process starts one): they take turns on each tracking row.

Each user projection has its own tracking row, so one that raises stops only itself: its
batch rolls back, the failure is recorded where `stats` and the metrics read it, and this
runner leaves it alone for a while (doubling, up to `MAX_BACKOFF_S`) before trying the same
batch again — once the projection's code is fixed and the process restarted, it resumes
from that position (ADR 0030). The views and the other projections go on meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from steptrail.domain.errors import StoreUnavailable, UnreadableEvent
from steptrail.projections.custom import ProjectionFailed

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


class Views(Protocol):
    def process_batch(self, limit: int = 1000) -> tuple[int, tuple[int, int]]: ...


class Tracked(Views, Protocol):
    """A user projection's store: a named tracked batch."""

    @property
    def name(self) -> str: ...


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
    """Runs `process_batch` of the views and of every projection until stopped, sleeping
    only when all have caught up."""

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
        self.log = log or structlog.get_logger()
        self.projections = [Isolated(p, log=self.log) for p in projections]

    def run_once(self) -> int:
        """One batch of the views; returns the number of events folded."""
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
        """Project until `stop` is set; a store outage is logged and retried. The views and
        the projections are tried separately, so neither one's trouble stops the other."""
        while not stop.is_set():
            consumed, busy = 0, False
            try:
                consumed = self.run_once()
            except StoreUnavailable as error:
                self.log.warning("projection_failed", error=str(error)[:200])
            except UnreadableEvent as error:
                # The views stop at the event before it (nothing is skipped) and the runner
                # keeps trying; the worker around it carries on (ADR 0019).
                self.log.error(  # noqa: TRY400 - the message names the row; a traceback adds nothing
                    "projection_stalled", error=str(error)[:300]
                )
            try:
                busy = self.run_projections_once()
            except StoreUnavailable as error:
                self.log.warning("projection_failed", error=str(error)[:200])
            if consumed < self.batch and not busy:
                stop.wait(interval)
