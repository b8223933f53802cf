"""Where the reporting views live, and the tracked batch that maintains them.

`process_batch` is the exactly-once unit: in one transaction it takes the runner's tracking
row (locked on PostgreSQL, so a second runner waits and then starts where the first
stopped), reads the next notifications, folds them with `projections.reporting.fold_batch`,
writes the view changes and moves the position. A crash anywhere before the commit leaves
both untouched; the batch is simply done again.

The two backends differ only in how ids, instants and JSON are stored; each store provides a
`Dialect` for that, and this module holds the logic once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from steptrail.domain.run import RunState
from steptrail.infrastructure.codec import decode_event
from steptrail.infrastructure.store_base import RANGE_RUNS, range_end
from steptrail.projections.reporting import (
    DeadLetterRow,
    Notification,
    Position,
    RunSummary,
    fold_batch,
)

PROJECTION = "reporting"


class Tx(Protocol):
    """A transaction (or read) that runs named queries."""

    def all(self, name: str, params: Mapping[str, Any]) -> list[Any]: ...
    def run(self, name: str, params: Mapping[str, Any]) -> None: ...
    def many(self, name: str, params: Sequence[Mapping[str, Any]]) -> None: ...


class Dialect(Protocol):
    """How a backend runs named queries and stores ids, instants and JSON."""

    def reporting_write(self) -> AbstractContextManager[Tx]: ...
    def reporting_read(self) -> AbstractContextManager[Tx]: ...
    def reporting_snapshot(self) -> AbstractContextManager[Tx]:
        """A read whose statements all see one snapshot."""
        ...

    def db_id(self, value: UUID) -> Any: ...
    def db_ids(self, values: Sequence[UUID]) -> Any: ...
    def db_time(self, value: datetime | None) -> Any: ...
    def py_time(self, value: Any) -> datetime | None: ...
    def db_json(self, value: Any) -> Any: ...
    def db_now(self) -> Any:
        """The store's clock as a query parameter (None where SQL reads it itself)."""
        ...


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
_LATEST = datetime(9999, 12, 30, tzinfo=UTC)
_LAST_ID = UUID(int=(1 << 128) - 1)


@dataclass(frozen=True)
class PageKey:
    """Where a page of runs ends: the (created_at, run_id) of its last row. A URL carries it
    as `<microseconds since the epoch>.<run id hex>`."""

    created_at: datetime
    run_id: UUID | None = None

    def encode(self) -> str:
        delta = self.created_at.astimezone(UTC) - _EPOCH
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return f"{micros}.{self.run_id.hex if self.run_id else ''}"

    @classmethod
    def decode(cls, text: str) -> PageKey:
        """Raises ValueError for anything but what `encode` writes."""
        micros, _, hex_id = text.partition(".")
        if not micros.lstrip("-").isdigit() or len(hex_id) != 32:
            raise ValueError(f"not a page key: {text!r}")
        return cls(_EPOCH + timedelta(microseconds=int(micros)), UUID(hex=hex_id))


@dataclass(frozen=True)
class Health:
    """Live queue figures from the run index."""

    oldest_queued_at: datetime | None
    stale_leases: int
    now: datetime


@dataclass(frozen=True)
class ViewsRange:
    """One keyset range of run ids of the views, read in one snapshot (`verify`, ADR 0040):
    where it ends, the position the views had reached, their rows of the range, and the
    range's events up to that position."""

    last: UUID
    position: Position
    summaries: list[RunSummary]
    dead_letters: list[DeadLetterRow]
    notifications: list[Notification]


@dataclass(frozen=True)
class RunnerHealth:
    """The reporting runner's position, and how many batches in a row failed (0: healthy)."""

    position: Position
    failures: int
    last_error: str | None


class ReportingStore:
    """The reporting views of one database (see the module docstring)."""

    def __init__(self, dialect: Dialect) -> None:
        self.d = dialect

    # -- maintaining ---------------------------------------------------------------------------

    def process_batch(self, limit: int = 1000) -> tuple[int, Position]:
        """Fold the next `limit` notifications into the views, exactly once.

        Returns (notifications consumed, position reached).
        """
        with self.d.reporting_write() as tx:
            tx.run("init_tracking", {"projection": PROJECTION})
            (row,) = tx.all("lock_tracking", {"projection": PROJECTION})
            position: Position = (int(row["position_tx"]), int(row["position"]))
            notes = [
                self._notification(r)
                for r in tx.all(
                    "select_notifications",
                    {"after_tx": position[0], "after": position[1], "limit": limit},
                )
            ]
            if not notes:
                return 0, position
            ids = sorted({n.run_id for n in notes})
            previous = {
                s.run_id: s
                for s in map(self._summary, tx.all("select_summaries", {"ids": self.d.db_ids(ids)}))
            }
            result = fold_batch(previous, notes)
            tx.many("upsert_summary", [self._summary_params(s) for s in result.summaries.values()])
            tx.many(
                "add_status_count",
                [
                    {"agent": agent, "status": status, "delta": delta}
                    for (agent, status), delta in sorted(result.counts.items())
                    if delta
                ],
            )
            tx.many(
                "upsert_dead_letter", [self._dead_letter_params(d) for d in result.dead_letters]
            )
            tx.run(
                "update_tracking",
                {
                    "projection": PROJECTION,
                    "position_tx": result.position[0],
                    "position": result.position[1],
                },
            )
            return len(notes), result.position

    def catch_up(
        self, *, batch: int = 1000, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Process batches until the views reach the log's head; returns events consumed.
        `progress(done, total)` counts events."""
        return catch_up(self.process_batch, self.head, batch=batch, progress=progress)

    def rebuild(
        self, *, batch: int = 5000, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Empty the views, rewind the runner, and fold the whole log again."""
        with self.d.reporting_write() as tx:
            tx.run("init_tracking", {"projection": PROJECTION})
            tx.all("lock_tracking", {"projection": PROJECTION})
            tx.run("clear_views", {"projection": PROJECTION})
        return self.catch_up(batch=batch, progress=progress)

    # -- reading -------------------------------------------------------------------------------

    def position(self) -> Position:
        with self.d.reporting_read() as tx:
            rows = tx.all("select_tracking", {"projection": PROJECTION})
        return (int(rows[0]["position_tx"]), int(rows[0]["position"])) if rows else (0, 0)

    def record_failure(self, error: str) -> None:
        """Count a batch that failed (and rolled back), with its error, for operators."""
        with self.d.reporting_write() as tx:
            tx.run("record_view_failure", {"projection": PROJECTION, "error": error[:500]})

    def runner(self) -> RunnerHealth:
        """Where the views' runner stands and whether its batches keep failing."""
        with self.d.reporting_read() as tx:
            rows = tx.all("select_tracking", {"projection": PROJECTION})
        if not rows:
            return RunnerHealth(position=(0, 0), failures=0, last_error=None)
        row = rows[0]
        return RunnerHealth(
            position=(int(row["position_tx"]), int(row["position"])),
            failures=int(row["failures"]),
            last_error=row["last_error"],
        )

    def head(self) -> int:
        """How many events the log holds (the total a rebuild works through)."""
        with self.d.reporting_read() as tx:
            return int(tx.all("max_notification_id", {})[0]["head"])

    def status_counts(self) -> dict[tuple[str, str], int]:
        with self.d.reporting_read() as tx:
            rows = tx.all("select_status_counts", {})
        return {(r["agent"], r["status"]): int(r["count"]) for r in rows}

    def reason_counts(self) -> dict[tuple[str, str], int]:
        with self.d.reporting_read() as tx:
            rows = tx.all("select_reason_counts", {})
        return {(r["status"], r["reason"]): int(r["count"]) for r in rows}

    def dead_letters(self, *, limit: int = 50, agent: str | None = None) -> list[DeadLetterRow]:
        with self.d.reporting_read() as tx:
            rows = tx.all("select_dead_letters", {"limit": limit, "agent": agent})
        return [self._dead_letter(r) for r in rows]

    def summaries(self) -> list[RunSummary]:
        with self.d.reporting_read() as tx:
            return [self._summary(r) for r in tx.all("select_all_summaries", {})]

    def summary(self, run_id: UUID) -> RunSummary | None:
        with self.d.reporting_read() as tx:
            rows = tx.all("select_summaries", {"ids": self.d.db_ids([run_id])})
        return self._summary(rows[0]) if rows else None

    def all_dead_letters(self) -> list[DeadLetterRow]:
        with self.d.reporting_read() as tx:
            return [self._dead_letter(r) for r in tx.all("select_all_dead_letters", {})]

    def range_from(self, lo: UUID, *, batch: int = RANGE_RUNS) -> ViewsRange:
        """The views' range of run ids that starts at `lo` (at most `batch` summaries and
        `batch` events of the log, plus the rest of its last run's), with the position
        reached, all read in one snapshot. The runner folds the log in position order and
        never passes a position before every event up to it has committed (ADR 0012), so
        the range's events up to that position are exactly what its summaries folded."""
        with self.d.reporting_snapshot() as tx:
            rows = tx.all("select_tracking", {"projection": PROJECTION})
            position: Position = (
                (int(rows[0]["position_tx"]), int(rows[0]["position"])) if rows else (0, 0)
            )
            ends = []
            for name in ("range_end_summaries", "range_end_log"):
                found = tx.all(name, {"lo": self.d.db_id(lo), "skip": batch - 1})
                ends.append(_uuid(found[0]["run_id"]) if found else None)
            last = range_end(ends)
            bounds = {"lo": self.d.db_id(lo), "hi": self.d.db_id(last)}
            summaries = [self._summary(r) for r in tx.all("range_summaries", bounds)]
            dead = [self._dead_letter(r) for r in tx.all("range_dead_letters", bounds)]
            notes = [
                self._notification(r)
                for r in tx.all(
                    "range_notifications", {**bounds, "upto_tx": position[0], "upto": position[1]}
                )
            ]
        return ViewsRange(last, position, summaries, dead, notes)

    def counts_and_counted(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """The maintained status counts and the summaries counted, in one snapshot."""
        with self.d.reporting_snapshot() as tx:
            live = tx.all("select_status_counts", {})
            counted = tx.all("count_summaries", {})
        return (
            {(r["agent"], r["status"]): int(r["count"]) for r in live},
            {(r["agent"], r["status"]): int(r["count"]) for r in counted},
        )

    def reasons_and_counted(
        self,
    ) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """The reason counts the triggers keep (ADR 0042) and the ended summaries counted by
        status and reason, in one snapshot."""
        with self.d.reporting_snapshot() as tx:
            live = tx.all("select_reason_counts", {})
            counted = tx.all("count_reasons", {})
        return (
            {(r["status"], r["reason"]): int(r["count"]) for r in live},
            {(r["status"], r["reason"]): int(r["count"]) for r in counted},
        )

    def notifications(self, *, upto: Position, batch: int = 5000) -> Iterator[Notification]:
        """The log from its start to `upto` (inclusive), in reading order."""
        position: Position = (0, 0)
        while position < upto:
            with self.d.reporting_read() as tx:
                rows = tx.all(
                    "select_notifications",
                    {"after_tx": position[0], "after": position[1], "limit": batch},
                )
            notes = [n for n in map(self._notification, rows) if n.position <= upto]
            if not notes:
                return
            yield from notes
            position = notes[-1].position

    def health(self) -> Health:
        with self.d.reporting_read() as tx:
            (row,) = tx.all("queue_health", {"now": self.d.db_now()})
        now = self.d.py_time(row["now"])
        assert now is not None
        return Health(
            oldest_queued_at=self.d.py_time(row["oldest_queued_at"]),
            stale_leases=int(row["stale_leases"]),
            now=now,
        )

    # -- the console's reads (ADR 0026) ---------------------------------------------------------

    def runs_page(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        reason: str | None = None,
        since: datetime | None = None,
        after: PageKey | None = None,
        limit: int = 50,
    ) -> list[RunSummary]:
        """One page of run summaries, newest first, after the key of the previous page's
        last row. The filter that narrows most drives the index walk."""
        if status and agent:
            name = "runs_page_agent_status"
        elif agent:
            name = "runs_page_agent"
        elif status:
            name = "runs_page_status"
        elif reason:
            name = "runs_page_reason"
        else:
            name = "runs_page_all"
        key = after or PageKey(_LATEST, _LAST_ID)
        params = {
            "status": status,
            "agent": agent,
            "reason": reason,
            "since": self.d.db_time(since or _EARLIEST),
            "after_at": self.d.db_time(key.created_at),
            "after_id": self._key_id(key.run_id),
            "limit": limit,
        }
        with self.d.reporting_read() as tx:
            return [self._summary(r) for r in tx.all(name, params)]

    def open_dead_letters(
        self, *, limit: int = 100, agent: str | None = None
    ) -> list[DeadLetterRow]:
        """Dead letters whose run is still failed (not retried since), newest first."""
        with self.d.reporting_read() as tx:
            rows = tx.all("dead_letters_open", {"limit": limit, "agent": agent})
        return [self._dead_letter(r) for r in rows]

    def throughput(self, since: datetime) -> list[tuple[datetime, str, int]]:
        """(minute, status, runs ended) for every minute since `since` with an ended run."""
        with self.d.reporting_read() as tx:
            rows = tx.all("throughput_by_minute", {"since": self.d.db_time(since)})
        return [
            (_EPOCH + timedelta(minutes=int(r["minute"])), str(r["status"]), int(r["n"]))
            for r in rows
        ]

    def recent_step_durations(self, limit: int = 5000) -> list[tuple[datetime, int]]:
        """(recorded at, duration in ms) of the newest `limit` steps of the log."""
        with self.d.reporting_read() as tx:
            rows = tx.all("recent_step_durations", {"limit": limit})
        found = []
        for r in rows:
            at = self.d.py_time(r["recorded_at"])
            assert at is not None
            found.append((at, int(json.loads(bytes(r["state"])).get("duration_ms", 0))))
        return found

    def _key_id(self, run_id: UUID | None) -> Any:
        # Above every id: hex text on SQLite ('g' sorts after 'f'), the largest UUID on
        # PostgreSQL (no run id has it: its version nibble is 7, or 4 before ADR 0052).
        if run_id is None:
            return "g" if isinstance(self.d.db_id(_LAST_ID), str) else _LAST_ID
        return self.d.db_id(run_id)

    # -- rows ----------------------------------------------------------------------------------

    def _notification(self, row: Any) -> Notification:
        at = self.d.py_time(row["recorded_at"])
        assert at is not None
        raw_id = row["run_id"]
        run_id = raw_id if isinstance(raw_id, UUID) else UUID(raw_id)
        return Notification(
            tx=int(row["tx_id"]),
            notification_id=int(row["notification_id"]),
            run_id=run_id,
            version=int(row["version"]),
            recorded_at=at,
            event=decode_event(
                row["topic"],
                bytes(row["state"]),
                where=f"event {row['version']} of run {run_id}",
            ),
        )

    def _summary(self, row: Any) -> RunSummary:
        state = row["state"]
        if isinstance(state, (str, bytes)):
            state = json.loads(state)
        return RunSummary(
            state=RunState.model_validate(state),
            steps=int(row["steps"]),
            step_ms=int(row["step_ms"]),
            suspensions=int(row["suspensions"]),
            created_at=self.d.py_time(row["created_at"]),
            updated_at=self.d.py_time(row["updated_at"]),
            ended_at=self.d.py_time(row["ended_at"]),
        )

    def _summary_params(self, s: RunSummary) -> dict[str, Any]:
        state = s.state
        return {
            "run_id": self.d.db_id(state.run_id),
            "agent": state.agent,
            "status": state.status.value,
            "reason": state.reason.value if state.reason else None,
            "state": self.d.db_json(state.model_dump(mode="json")),
            "steps": s.steps,
            "step_ms": s.step_ms,
            "suspensions": s.suspensions,
            "created_at": self.d.db_time(s.created_at),
            "updated_at": self.d.db_time(s.updated_at),
            "ended_at": self.d.db_time(s.ended_at),
        }

    def _dead_letter(self, row: Any) -> DeadLetterRow:
        run_id = row["run_id"]
        at = self.d.py_time(row["dead_lettered_at"])
        assert at is not None
        return DeadLetterRow(
            run_id=run_id if isinstance(run_id, UUID) else UUID(run_id),
            agent=row["agent"],
            reason=row["reason"],
            cause=row["cause"],
            failure_class=row["failure_class"],
            error_type=row["error_type"],
            requeue_count=int(row["requeue_count"]),
            dead_lettered_at=at,
        )

    def _dead_letter_params(self, d: DeadLetterRow) -> dict[str, Any]:
        return {
            "run_id": self.d.db_id(d.run_id),
            "agent": d.agent,
            "reason": d.reason,
            "cause": d.cause,
            "failure_class": d.failure_class,
            "error_type": d.error_type,
            "requeue_count": d.requeue_count,
            "dead_lettered_at": self.d.db_time(d.dead_lettered_at),
        }


def _uuid(value: Any) -> UUID:
    return value if isinstance(value, UUID) else UUID(value)


def catch_up(
    process_batch: Callable[[int], tuple[int, Any]],
    head: Callable[[], int],
    *,
    batch: int,
    progress: Callable[[int, int], None] | None,
) -> int:
    """Run `process_batch` until a batch comes back short (the reader reached the log's
    head); returns events consumed. Shared by the built-in views and user projections."""
    total = 0
    last = head() if progress is not None else 0
    while True:
        consumed, _ = process_batch(batch)
        total += consumed
        if progress is not None:
            progress(total, max(last, total))
        if consumed < batch:
            return total
