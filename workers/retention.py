"""The purge: removes whole runs whose retention window has passed, in bounded batches.

Each batch is one transaction that removes its runs from every table holding anything of
them and leaves a tombstone; an interrupted purge has removed whole runs only, and running it
again finishes the job. See ADR 0010 for what "delete" means for an append-only log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol
from uuid import UUID

import structlog

from steptrail.domain.retention import Category, RetentionPolicy
from steptrail.projections.custom import PurgeHook


class Purgeable(Protocol):
    def store_now(self) -> datetime: ...
    def count_purgeable(self, *, statuses: Sequence[str], cutoff: datetime) -> int: ...
    def purge_batch(
        self,
        *,
        category: str,
        statuses: Sequence[str],
        cutoff: datetime,
        limit: int,
        projections: Sequence[PurgeHook] = (),
    ) -> list[UUID]: ...
    def after_purge(self) -> None: ...


@dataclass
class PurgeReport:
    """How many runs each category lost, and the cutoffs applied."""

    removed: dict[str, int] = field(default_factory=dict)
    cutoffs: dict[str, datetime] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.removed.values())

    def summary(self) -> str:
        parts = [
            f"{self.removed.get(c, 0)} {c} (created before {self.cutoffs[c]:%Y-%m-%d %H:%M})"
            for c in self.cutoffs
        ]
        return f"Purged {self.total} run(s): " + ", ".join(parts) + "."

    def as_dict(self) -> dict[str, object]:
        return {
            "purged": self.total,
            "by_category": dict(self.removed),
            "cutoffs": {k: v.isoformat() for k, v in self.cutoffs.items()},
        }


class Purger:
    """Applies a retention policy to a store."""

    def __init__(
        self,
        store: Purgeable,
        policy: RetentionPolicy,
        *,
        batch: int = 100,
        log: structlog.typing.FilteringBoundLogger | None = None,
        projections: Sequence[PurgeHook] = (),
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be a positive integer")
        self.store = store
        self.policy = policy
        self.batch = batch
        self.log = log or structlog.get_logger()
        self.projections = tuple(projections)

    def purge(
        self,
        days: int | None = None,
        *,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> PurgeReport:
        """Purge every category by its window (`days` overrides all), oldest runs first."""
        now = self.store.store_now()
        report = PurgeReport()
        for category, cutoff in self.policy.cutoffs(now, days).items():
            statuses = [s.value for s in category.statuses]
            total = self.store.count_purgeable(statuses=statuses, cutoff=cutoff)
            report.cutoffs[category.value] = cutoff
            done = 0
            while True:
                ids = self.store.purge_batch(
                    category=category.value,
                    statuses=statuses,
                    cutoff=cutoff,
                    limit=self.batch,
                    projections=self.projections,
                )
                done += len(ids)
                if progress is not None:
                    progress(category.value, done, max(total, done))
                if len(ids) < self.batch:
                    break
            report.removed[category.value] = done
            self.log.info("runs_purged", category=category.value, runs=done)
        self.store.after_purge()
        return report


__all__ = ["Category", "PurgeReport", "Purger", "RetentionPolicy"]
