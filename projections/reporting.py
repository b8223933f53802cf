"""The reporting views: run summaries, status counts per agent, and the dead-letter view.

They are folds over the notification log, processed in batches by a tracked runner (the
view's changes and its tracking position commit together), and rebuilt by running the same
fold from the first notification. Everything here is pure: the runner reads the previous
summaries of a batch's runs, calls `fold_batch`, and writes back what it returns.

* A run summary is the run's folded `RunState` plus reporting figures: steps, tokens, cost,
  time spent in steps, suspensions, when it was created, last changed and ended.
* Status counts are kept per (agent, status) and moved by one on every status change, so
  they always equal counting the summaries.
* The dead-letter view has a row per run that was dead-lettered: reason, failure class,
  requeue count, cause, and when.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from steptrail.domain.run import Run, RunEvent, RunState, apply

VIEWS = ("run_summaries", "status_counts", "dead_letters")


@dataclass(frozen=True)
class RunSummary:
    """One run, as the reporting views see it."""

    state: RunState
    steps: int = 0
    step_ms: int = 0
    suspensions: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def run_id(self) -> UUID:
        return self.state.run_id


@dataclass(frozen=True)
class DeadLetterRow:
    run_id: UUID
    agent: str
    reason: str
    cause: str
    failure_class: str | None
    error_type: str | None
    requeue_count: int
    dead_lettered_at: datetime


Position = tuple[int, int]
"""Where a reader of the log stands: (inserting transaction, notification id). Readers go
through the log in this order; on SQLite the transaction part is always 0 (ADR 0012)."""


@dataclass(frozen=True)
class Notification:
    """One event of the log, with its position and the store's time."""

    notification_id: int
    run_id: UUID
    version: int
    recorded_at: datetime
    event: RunEvent
    tx: int = 0

    @property
    def position(self) -> Position:
        return (self.tx, self.notification_id)


@dataclass
class BatchResult:
    """What a batch changes: the summaries to upsert, count deltas, dead letters to insert,
    and the position reached."""

    summaries: dict[UUID, RunSummary] = field(default_factory=dict)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    dead_letters: list[DeadLetterRow] = field(default_factory=list)
    position: Position = (0, 0)


def summarise(previous: RunSummary | None, event: RunEvent, at: datetime) -> RunSummary:
    """The summary after `event`, recorded at the store's instant `at`."""
    state = apply(previous.state if previous is not None else None, event)
    summary = previous or RunSummary(state=state, created_at=at)
    if isinstance(event, Run.StepRecorded):
        summary = replace(
            summary, steps=summary.steps + 1, step_ms=summary.step_ms + event.duration_ms
        )
    elif isinstance(event, Run.Suspended):
        summary = replace(summary, suspensions=summary.suspensions + 1)
    # A retried run (Run.Retried) leaves its terminal status: it has not ended any more.
    ended_at = (summary.ended_at or at) if state.status.is_terminal else None
    return replace(summary, state=state, updated_at=at, ended_at=ended_at)


def fold_batch(
    previous: Mapping[UUID, RunSummary], notifications: Iterable[Notification]
) -> BatchResult:
    """Fold a batch of notifications (in log order) onto the previous summaries of its runs.

    Events of a run whose creation the views never saw (purged history) are ignored.
    """
    result = BatchResult()
    current: dict[UUID, RunSummary] = dict(previous)
    for note in notifications:
        result.position = max(result.position, note.position)
        before = current.get(note.run_id)
        if before is None and not isinstance(note.event, (Run.Queued, Run.Started)):
            continue
        after = summarise(before, note.event, note.recorded_at)
        current[note.run_id] = after
        result.summaries[note.run_id] = after
        old_key = (before.state.agent, before.state.status.value) if before else None
        new_key = (after.state.agent, after.state.status.value)
        if old_key != new_key:
            if old_key is not None:
                result.counts[old_key] -= 1
            result.counts[new_key] += 1
        if isinstance(note.event, Run.DeadLettered):
            result.dead_letters.append(
                DeadLetterRow(
                    run_id=note.run_id,
                    agent=after.state.agent,
                    reason=note.event.reason.value,
                    cause=note.event.cause,
                    failure_class=(
                        after.state.failure_class.value if after.state.failure_class else None
                    ),
                    error_type=after.state.error_type,
                    requeue_count=after.state.requeue_count,
                    dead_lettered_at=note.recorded_at,
                )
            )
    return result


def _utc(value: datetime | None) -> datetime | None:
    return value.astimezone(UTC) if value is not None else None


def normalise_summary(s: RunSummary) -> RunSummary:
    """The summary with instants in UTC, so rows from different backends compare equal."""
    return replace(
        s, created_at=_utc(s.created_at), updated_at=_utc(s.updated_at), ended_at=_utc(s.ended_at)
    )


def normalise_dead_letter(d: DeadLetterRow) -> DeadLetterRow:
    return replace(d, dead_lettered_at=_utc(d.dead_lettered_at) or d.dead_lettered_at)


def counts_from(summaries: Iterable[RunSummary]) -> Counter[tuple[str, str]]:
    """Status counts per agent, counted from scratch (what the incremental counts must equal)."""
    return Counter((s.state.agent, s.state.status.value) for s in summaries)


def summary_figures(summary: RunSummary) -> dict[str, Any]:
    """The reporting figures of a summary, JSON-compatible."""
    s = summary.state
    duration_ms = None
    if summary.ended_at is not None and summary.created_at is not None:
        duration_ms = int((summary.ended_at - summary.created_at).total_seconds() * 1000)
    return {
        "run_id": str(s.run_id),
        "agent": s.agent,
        "status": s.status.value,
        "reason": s.reason.value if s.reason else None,
        "steps": summary.steps,
        "step_ms": summary.step_ms,
        "tokens": s.tokens,
        "cost": s.cost,
        "requeues": s.requeue_count,
        "suspensions": summary.suspensions,
        "created_at": summary.created_at.isoformat() if summary.created_at else None,
        "ended_at": summary.ended_at.isoformat() if summary.ended_at else None,
        "duration_ms": duration_ms,
    }
