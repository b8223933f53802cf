"""The reaper: reclaims or dead-letters running runs whose lease expired.

`reap_once(limit)` does one bounded pass and returns counts; `reap_every` is the thin loop
around it for deployments without cron. Staleness is judged by the store's clock inside the
store's query, so no `now` is passed in (ADR 0003). Every mutation is an append at the
version the reaper saw: if the worker's heartbeat landed in between, the append conflicts
and the run is skipped, so a slow worker always beats the reaper (ADR 0006). Several reapers
may run at once for the same reason.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.domain.ports import RunStore
from steptrail.domain.retry import DeadLetter, Reclaim, RetryPolicy

if TYPE_CHECKING:
    import structlog


@dataclass
class ReapReport:
    """What one pass did: N stale runs found = requeued + dead-lettered + skipped."""

    requeued: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    runs: list[dict[str, str]] = field(default_factory=list)

    @property
    def reaped(self) -> int:
        return self.requeued + self.dead_lettered + self.skipped

    def summary(self) -> str:
        return (
            f"Reaped {self.reaped} stale run(s): {self.requeued} requeued, "
            f"{self.dead_lettered} dead-lettered, {self.skipped} skipped "
            "(renewed or already moved on)."
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "reaped": self.reaped,
            "requeued": self.requeued,
            "dead_lettered": self.dead_lettered,
            "skipped": self.skipped,
            "runs": self.runs,
        }


class Reaper:
    """Acts on stale runs by the retry policy's `on_stale` verdict."""

    def __init__(
        self,
        store: RunStore,
        policy: RetryPolicy,
        *,
        actor: str,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.actor = actor
        if log is None:
            import structlog

            log = structlog.get_logger()
        self.log = log.bind(worker_id=actor)

    def reap_once(self, limit: int = 50) -> ReapReport:
        """One pass over at most `limit` stale runs, oldest expired lease first."""
        if limit < 1:
            raise ValueError("limit must be a positive integer")
        report = ReapReport()
        for run in self.store.stale(limit):
            decision = self.policy.on_stale(run.state)
            holder = run.state.holder or "?"
            log = self.log.bind(run_id=str(run.id), version=run.version, holder=holder)
            if isinstance(decision, Reclaim):
                run.reclaim(actor=self.actor)
                verdict = "requeued"
            else:
                assert isinstance(decision, DeadLetter)
                run.dead_letter(actor=self.actor, reason=decision.reason, cause=decision.cause)
                verdict = "dead_lettered"
            try:
                self.store.append(run)
            except VersionConflict:
                # The holder appended (a heartbeat) or somebody else moved the run on since
                # our scan: their write wins, and this run is not ours to touch.
                report.skipped += 1
                report.runs.append({"run_id": str(run.id), "verdict": "skipped"})
                log.info("reap_skipped")
                continue
            if verdict == "requeued":
                report.requeued += 1
                log.info("run_reclaimed", requeue_count=run.state.requeue_count)
            else:
                report.dead_lettered += 1
                assert isinstance(decision, DeadLetter)
                log.warning("run_dead_lettered", reason=decision.reason.value, cause=decision.cause)
            report.runs.append({"run_id": str(run.id), "verdict": verdict})
        return report

    def reap_every(
        self,
        seconds: float,
        *,
        limit: int = 50,
        stop: threading.Event | None = None,
        on_report: Callable[[ReapReport], None] | None = None,
    ) -> None:
        """Reap every `seconds` until `stop` is set; a store outage is logged, not fatal, and
        so is any other failed pass (logged with its traceback): `reap --every` is a daemon,
        and the next pass may succeed (a schema upgraded under it, a lock timeout)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                report = self.reap_once(limit)
            except StoreUnavailable as error:
                self.log.warning("reap_failed", error=str(error)[:200])
            except Exception:
                self.log.exception("reap_error")
            else:
                if on_report is not None:
                    on_report(report)
                # A full batch means more may be waiting: go again without sleeping.
                if report.reaped >= limit:
                    continue
            stop.wait(seconds)
