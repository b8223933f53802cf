"""The purge: removes whole runs whose retention window has passed, in bounded batches.

A run that a worker holds under a live lease is never removed, whatever its age: it is
reported as skipped, and goes once it settles or its lease expires. Each batch is one
transaction that removes its runs from every table holding anything of them and leaves a
tombstone; an interrupted purge has removed whole runs only, and running it
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
    def live_purgeable(self, *, statuses: Sequence[str], cutoff: datetime) -> list[UUID]: ...
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
    """How many runs each category lost, the cutoffs applied, and the runs left alone
    because a worker holds them under a live lease."""

    removed: dict[str, int] = field(default_factory=dict)
    cutoffs: dict[str, datetime] = field(default_factory=dict)
    skipped: dict[str, list[UUID]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.removed.values())

    def summary(self) -> str:
        parts = [
            f"{self.removed.get(c, 0)} {c} (created before {self.cutoffs[c]:%Y-%m-%d %H:%M})"
            for c in self.cutoffs
        ]
        text = f"Purged {self.total} run(s): " + ", ".join(parts) + "."
        held = sum(len(ids) for ids in self.skipped.values())
        if held:
            text += f" Skipped {held} run(s) running under a live lease."
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "purged": self.total,
            "by_category": dict(self.removed),
            "cutoffs": {k: v.isoformat() for k, v in self.cutoffs.items()},
            "skipped_live_lease": {k: [str(i) for i in v] for k, v in self.skipped.items()},
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
            # A run held under a live lease is never purged (a write tool may be in flight);
            # the batches skip it by the store's clock, and the report names it.
            held = self.store.live_purgeable(statuses=statuses, cutoff=cutoff)
            if held:
                report.skipped[category.value] = held
                self.log.warning(
                    "purge_skipped_live_runs",
                    category=category.value,
                    runs=len(held),
                    run_ids=[str(i) for i in held[:20]],
                )
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
