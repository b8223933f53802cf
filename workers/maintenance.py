"""Maintenance of the views: rebuild them from the log, and verify live == rebuilt.

Verification folds the log with the same pure folds the live views use (`projections/`),
then compares. Both go through the run ids in keyset ranges (ADR 0040), each range read in
one snapshot, so memory holds one range, never one row per run. The run index is compared
over the whole log; the reporting views up to the position their runner had reached when
the range was read, so a runner that lags is not mistaken for drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol
from uuid import UUID

from steptrail.projections.reporting import (
    DeadLetterRow,
    Notification,
    Position,
    RunSummary,
    fold_batch,
    normalise_dead_letter,
    normalise_summary,
)
from steptrail.projections.run_index import IndexRange, normalise

REBUILDABLE = ("all", "run-index", "reporting")


class IndexStore(Protocol):
    def index_ranges(self, batch: int = ...) -> Iterator[IndexRange]: ...
    def rebuild_index(
        self, progress: Callable[[int], None] | None = None, *, batch: int = ...
    ) -> int: ...


class ViewsRange(Protocol):
    @property
    def last(self) -> UUID: ...
    @property
    def position(self) -> Position: ...
    @property
    def summaries(self) -> list[RunSummary]: ...
    @property
    def dead_letters(self) -> list[DeadLetterRow]: ...
    @property
    def notifications(self) -> list[Notification]: ...


class Views(Protocol):
    def head(self) -> int: ...
    def range_from(self, lo: UUID, *, batch: int = ...) -> ViewsRange: ...
    def counts_and_counted(
        self,
    ) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]: ...
    def reasons_and_counted(
        self,
    ) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]: ...
    def rebuild(
        self, *, batch: int = 5000, progress: Callable[[int, int], None] | None = None
    ) -> int: ...


def rebuild(
    store: IndexStore,
    views: Views,
    view: str,
    *,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, int]:
    """Rebuild `view` (one of REBUILDABLE); returns what each rebuild processed."""
    if view not in REBUILDABLE:
        raise ValueError(f"unknown view {view!r}; choose from {', '.join(REBUILDABLE)}")
    done: dict[str, int] = {}
    if view in ("run-index", "all"):
        head = views.head()
        done["run-index"] = store.rebuild_index(
            (lambda n: progress("run-index", n, head)) if progress else None
        )
    if view in ("reporting", "all"):
        done["reporting"] = views.rebuild(
            progress=(lambda n, total: progress("reporting", n, total)) if progress else None
        )
    return done


def verify_index(store: IndexStore, *, batch: int | None = None) -> list[str]:
    """Differences between the live run index and one rebuilt from the log, range by range
    of run ids, each range's rows and log read in one snapshot (workers may be writing).
    `batch` bounds a range (the store's default if None)."""
    problems: list[str] = []
    ranges = store.index_ranges() if batch is None else store.index_ranges(batch)
    for index, from_log, unreadable in ranges:
        live = {r.run_id: normalise(r) for r in index}
        rebuilt = {r.run_id: normalise(r) for r in from_log if r.run_id not in unreadable}
        problems += differences("run index", live, rebuilt)
        problems += [
            f"run index {run_id}: the live row cannot be read ({why})"
            for run_id, why in unreadable.items()
        ]
    return sorted(problems)


def verify_views(views: Views, *, batch: int | None = None) -> list[str]:
    """Differences between the live reporting views and a fold of the log, range by range
    of run ids: each range's summaries and dead letters against a fold of its runs' events
    up to the position the views had reached, all read in one snapshot. The status counts
    and the reason counts (ADR 0042) are compared with the summaries counted, in one snapshot:
    the summaries are checked against the log, the counts against the summaries."""
    problems: list[str] = []
    lo: UUID | None = UUID(int=0)
    while lo is not None:
        part = views.range_from(lo) if batch is None else views.range_from(lo, batch=batch)
        scratch = fold_batch({}, part.notifications)
        live = {s.run_id: normalise_summary(s) for s in part.summaries}
        rebuilt = {k: normalise_summary(v) for k, v in scratch.summaries.items()}
        problems += differences("run summaries", live, rebuilt)
        dead = {d.run_id: normalise_dead_letter(d) for d in part.dead_letters}
        rebuilt_dead = {d.run_id: normalise_dead_letter(d) for d in scratch.dead_letters}
        problems += differences("dead letters", dead, rebuilt_dead)
        lo = UUID(int=part.last.int + 1) if part.last.int < (1 << 128) - 1 else None
    counts, counted = views.counts_and_counted()
    if counts != counted:
        problems.append(f"status counts: live {counts} != rebuilt {counted}")
    reasons, recounted = views.reasons_and_counted()
    if reasons != recounted:
        problems.append(f"reason counts: live {reasons} != rebuilt {recounted}")
    return sorted(problems)


def differences(what: str, live: Mapping[Any, Any], rebuilt: Mapping[Any, Any]) -> list[str]:
    """One line per key missing on either side or differing, sorted."""
    problems = [f"{what} {k}: live but not in the log" for k in live.keys() - rebuilt.keys()]
    problems += [f"{what} {k}: in the log but not live" for k in rebuilt.keys() - live.keys()]
    problems += [
        f"{what} {k}: live {live[k]} != rebuilt {rebuilt[k]}"
        for k in live.keys() & rebuilt.keys()
        if live[k] != rebuilt[k]
    ]
    return sorted(problems)
