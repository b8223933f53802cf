"""Maintenance of the views: rebuild them from the log, and verify live == rebuilt.

Verification folds the log into a scratch copy in memory with the same pure folds the live
views use (`projections/`), then compares. The run index is compared over the whole log;
the reporting views up to the position their runner has reached, so a runner that lags is
not mistaken for drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from steptrail.projections.reporting import (
    DeadLetterRow,
    Notification,
    Position,
    RunSummary,
    counts_from,
    fold_batch,
    normalise_dead_letter,
    normalise_summary,
)
from steptrail.projections.run_index import RunRow, normalise

REBUILDABLE = ("all", "run-index", "reporting")


class IndexStore(Protocol):
    def index_and_rebuilt(self) -> tuple[list[RunRow], list[RunRow]]: ...
    def rebuild_index(self, progress: Callable[[int], None] | None = None) -> int: ...


class Views(Protocol):
    def position(self) -> Position: ...
    def head(self) -> int: ...
    def summaries(self) -> list[RunSummary]: ...
    def status_counts(self) -> dict[tuple[str, str], int]: ...
    def all_dead_letters(self) -> list[DeadLetterRow]: ...
    def notifications(self, *, upto: Position, batch: int = 5000) -> Iterator[Notification]: ...
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


def verify_index(store: IndexStore) -> list[str]:
    """Differences between the live run index and one rebuilt from the log, both read in
    one snapshot (workers may be writing)."""
    index, from_log = store.index_and_rebuilt()
    live = {r.run_id: normalise(r) for r in index}
    rebuilt = {r.run_id: normalise(r) for r in from_log}
    return differences("run index", live, rebuilt)


def verify_views(views: Views, *, attempts: int = 5) -> list[str]:
    """Differences between the live reporting views and a scratch fold of the log up to the
    same position (read again until no batch committed in between)."""
    for _ in range(attempts):
        position = views.position()
        live = {s.run_id: normalise_summary(s) for s in views.summaries()}
        counts = views.status_counts()
        dead = {d.run_id: normalise_dead_letter(d) for d in views.all_dead_letters()}
        if views.position() == position:
            break
    scratch = fold_batch({}, views.notifications(upto=position))
    rebuilt = {k: normalise_summary(v) for k, v in scratch.summaries.items()}
    problems = differences("run summaries", live, rebuilt)
    expected = {k: v for k, v in counts_from(scratch.summaries.values()).items() if v}
    if counts != expected:
        problems.append(f"status counts: live {counts} != rebuilt {expected}")
    rebuilt_dead = {d.run_id: normalise_dead_letter(d) for d in scratch.dead_letters}
    return problems + differences("dead letters", dead, rebuilt_dead)


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
