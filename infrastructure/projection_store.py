"""The tracked batch that keeps a user projection, its rebuild, and its verification.

`process_batch` is the same exactly-once unit as the reporting views' (ADR 0009, 0028): in
one transaction it takes the projection's tracking row (locked on PostgreSQL, the write lock
on SQLite), reads the next events in the views' order (ADR 0012), hands each to the
projection together with a `Sql` handle on that very transaction, and moves the position.
Whatever the projection wrote commits with the position, or neither does.

If the projection raises, the batch rolls back — the projection stays exactly where it was —
and the failure (the event's position, run, topic and the error) is recorded in a
transaction of its own, for `stats` and the metrics; the first batch that commits again
clears it (ADR 0030). Only this projection stops: each projection has its own tracking row.

`verify` folds the log up to the live position into a scratch copy (an in-memory database on
SQLite, a private schema on PostgreSQL) with the same code and compares the tables row by row.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Protocol
from uuid import UUID

from steptrail.domain.errors import StoreUnavailable
from steptrail.infrastructure.codec import decode_event
from steptrail.infrastructure.reporting_store import Dialect, Tx, catch_up
from steptrail.projections.custom import (
    EventContext,
    Failure,
    Position,
    Projection,
    ProjectionFailed,
    Sql,
)

VERIFY_BATCH = 5000


class ProjectionTx(Tx, Protocol):
    """A reporting transaction that also hands out the user SQL handle."""

    def sql(self) -> Sql: ...
    def rows_of(self, table: str) -> list[tuple[Any, ...]]: ...
    def drop(self, table: str) -> None: ...


class ProjectionDialect(Dialect, Protocol):
    def reporting_write(self) -> AbstractContextManager[ProjectionTx]: ...
    def reporting_read(self) -> AbstractContextManager[ProjectionTx]: ...
    def scratch(
        self,
    ) -> AbstractContextManager[Callable[[], AbstractContextManager[ProjectionTx]]]: ...


@dataclass(frozen=True)
class TrackedStatus:
    """Where one tracked projection (built-in or yours) stands."""

    name: str
    position: Position
    lag: int
    failure: Failure | None


class _Raised(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.error)
        self.failure = failure


def _failure(
    error: BaseException,
    position: Position = (0, 0),
    run_id: UUID | None = None,
    topic: str | None = None,
) -> Failure:
    return Failure(
        position=position,
        run_id=run_id,
        topic=topic,
        error=f"{type(error).__name__}: {error}"[:1000],
        failed_at=None,
        attempts=1,
    )


def _position(row: Any) -> Position:
    return (int(row["tx_id"]), int(row["notification_id"]))


def _uuid(value: Any) -> UUID:
    return value if isinstance(value, UUID) else UUID(value)


class ProjectionStore:
    """One user projection over one database (see the module docstring)."""

    def __init__(self, dialect: ProjectionDialect, projection: Projection) -> None:
        if not projection.name:
            raise ValueError("a projection needs a name")
        self.d = dialect
        self.projection = projection
        self._tables_ready = False

    @property
    def name(self) -> str:
        return self.projection.name

    # -- maintaining ---------------------------------------------------------------------------

    def ensure_tables(self) -> None:
        """Let the projection create its tables (idempotently), once per store object.

        Raises:
            ProjectionFailed: its `create_tables` raised.
        """
        try:
            self._ensure_tables()
        except _Raised as raised:
            raise ProjectionFailed(self.name, raised.failure) from raised.__cause__

    def _ensure_tables(self) -> None:
        if self._tables_ready:
            return
        with self.d.reporting_write() as tx:
            self._create_tables(tx)
            tx.run("init_tracking", {"projection": self.name})
        self._tables_ready = True

    def _create_tables(self, tx: ProjectionTx) -> None:
        try:
            self.projection.create_tables(tx.sql())
        except Exception as error:
            raise _Raised(_failure(error)) from error

    def process_batch(self, limit: int = 1000) -> tuple[int, Position]:
        """Fold the next `limit` events into the projection, exactly once.

        Returns (events consumed, position reached).

        Raises:
            ProjectionFailed: the projection raised; nothing of the batch was kept.
        """
        try:
            self._ensure_tables()
            idle = self._idle()
            if idle is not None:
                return 0, idle
            with self.d.reporting_write() as tx:
                return self._batch(tx, limit)
        except _Raised as raised:
            failure, cause = raised.failure, raised.__cause__
        except StoreUnavailable:
            raise
        except Exception as error:  # noqa: BLE001 - committing what the projection wrote failed (e.g. a deferred constraint)
            failure, cause = _failure(error), error
        if failure.topic is None:  # not an event's fault: it stands where it stood
            failure = replace(failure, position=self.position())
        self._record(failure)
        raise ProjectionFailed(self.name, failure) from cause

    def _idle(self) -> Position | None:
        """The position, if no event after it is visible yet (None: there is work). A read
        first, so that an idle runner does not take SQLite's write lock every interval."""
        with self.d.reporting_read() as tx:
            rows = tx.all("select_tracking", {"projection": self.name})
            position = (int(rows[0]["position_tx"]), int(rows[0]["position"])) if rows else (0, 0)
            ahead = tx.all(
                "select_notifications", {"after_tx": position[0], "after": position[1], "limit": 1}
            )
        return None if ahead else position

    def _batch(self, tx: ProjectionTx, limit: int) -> tuple[int, Position]:
        tx.run("init_tracking", {"projection": self.name})
        (row,) = tx.all("lock_tracking", {"projection": self.name})
        position: Position = (int(row["position_tx"]), int(row["position"]))
        rows = tx.all(
            "select_notifications", {"after_tx": position[0], "after": position[1], "limit": limit}
        )
        if not rows:
            return 0, position
        position = self._fold(rows, tx.sql())
        params = {"projection": self.name, "position_tx": position[0], "position": position[1]}
        tx.run("update_tracking", params)
        tx.run("clear_failure", {"projection": self.name})
        return len(rows), position

    def _fold(self, rows: list[Any], sql: Sql) -> Position:
        """Hand each row's event to the projection, in order; returns the last position.

        Raises:
            _Raised: the projection raised on an event (or the event could not be read).
        """
        wanted = frozenset(self.projection.topics)
        run_ids: dict[Any, UUID] = {}  # a batch holds few runs, each many times
        position: Position = (0, 0)
        for r in rows:
            position = (int(r["tx_id"]), int(r["notification_id"]))
            topic = str(r["topic"])
            if wanted and topic not in wanted:
                continue
            raw_id = r["run_id"]
            run_id = run_ids.get(raw_id) or run_ids.setdefault(raw_id, _uuid(raw_id))
            try:
                where = f"event {r['version']} of run {run_id}"
                event = decode_event(topic, bytes(r["state"]), where=where)
                recorded_at = self.d.py_time(r["recorded_at"])
                assert recorded_at is not None
                ctx = EventContext(
                    run_id=run_id,
                    version=int(r["version"]),
                    recorded_at=recorded_at,
                    position=position,
                    sql=sql,
                    projection=self.name,
                )
                self.projection.apply(event, ctx)
            except Exception as error:  # any error of user code stops only this projection
                raise _Raised(_failure(error, position, run_id, topic)) from error
        return position

    def _record(self, failure: Failure) -> None:
        with self.d.reporting_write() as tx:
            tx.run(
                "record_failure",
                {
                    "projection": self.name,
                    "position_tx": failure.position[0],
                    "position": failure.position[1],
                    "run_id": self.d.db_id(failure.run_id) if failure.run_id else None,
                    "topic": failure.topic,
                    "error": failure.error,
                    "now": self.d.db_now(),
                },
            )

    def catch_up(
        self, *, batch: int = 1000, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Process batches until the projection reaches the log's head; returns events
        consumed. `progress(done, total)` counts events."""
        return catch_up(self.process_batch, self._head, batch=batch, progress=progress)

    def rebuild(
        self, *, batch: int = 5000, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Drop the projection's tables, create them again, rewind it, and fold the whole
        log again in batches of `batch` events (one transaction each).

        Raises:
            ProjectionFailed: the projection raised (if in `create_tables`, nothing changed).
        """
        try:
            with self.d.reporting_write() as tx:
                tx.run("init_tracking", {"projection": self.name})
                tx.all("lock_tracking", {"projection": self.name})
                for table in self.projection.tables:
                    tx.drop(table)
                self._create_tables(tx)
                tx.run("rewind_tracking", {"projection": self.name})
        except _Raised as raised:
            raise ProjectionFailed(self.name, raised.failure) from raised.__cause__
        self._tables_ready = True
        return self.catch_up(batch=batch, progress=progress)

    # -- reading -------------------------------------------------------------------------------

    def position(self) -> Position:
        with self.d.reporting_read() as tx:
            rows = tx.all("select_tracking", {"projection": self.name})
        return (int(rows[0]["position_tx"]), int(rows[0]["position"])) if rows else (0, 0)

    def wait_for_run(self, run_id: UUID, *, timeout: float = 10.0) -> Position:
        """Block until the projection has folded every event the run has now (read your
        own writes; eventsourcing's `wait`), polling with backoff. Something must be running
        the projection (a worker, `steptrail project --every`, or `catch_up`).

        Returns the projection's position. Raises TimeoutError, or LookupError for a run
        the log does not hold.
        """
        with self.d.reporting_read() as tx:
            rows = tx.all("run_head_position", {"run_id": self.d.db_id(run_id)})
        if not rows:
            raise LookupError(f"the log holds no event of run {run_id}")
        target: Position = (int(rows[0]["tx_id"]), int(rows[0]["notification_id"]))
        deadline = time.monotonic() + timeout
        pause = 0.01
        while (position := self.position()) < target:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"projection {self.name!r} at {position} has not reached {target}"
                )
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.5)
        return position

    def _head(self) -> int:
        with self.d.reporting_read() as tx:
            return int(tx.all("max_notification_id", {})[0]["head"])

    def verify(self, *, attempts: int = 5) -> list[str]:
        """Differences between the projection's live tables and a rebuild of them, into a
        scratch copy, from the log up to the live position (read again until no batch
        committed in between)."""
        self.ensure_tables()
        live: dict[str, Counter[tuple[Any, ...]]] = {}
        position = self.position()
        for _ in range(attempts):
            with self.d.reporting_read() as tx:
                live = {t: Counter(tx.rows_of(t)) for t in self.projection.tables}
            again = self.position()
            if again == position:
                break
            position = again
        rebuilt = self._scratch_fold(position)
        problems: list[str] = []
        for table in self.projection.tables:
            for row in sorted((live[table] - rebuilt[table]).elements(), key=repr):
                problems.append(f"{self.name}: {table} row {row} is live but not in a rebuild")
            for row in sorted((rebuilt[table] - live[table]).elements(), key=repr):
                problems.append(f"{self.name}: {table} row {row} is in a rebuild but not live")
        return problems

    def _scratch_fold(self, upto: Position) -> dict[str, Counter[tuple[Any, ...]]]:
        with self.d.scratch() as transaction:
            try:
                with transaction() as tx:
                    self._create_tables(tx)
                for chunk in self._log_upto(upto):
                    with transaction() as tx:
                        self._fold(chunk, tx.sql())
            except _Raised as raised:
                raise ProjectionFailed(self.name, raised.failure) from raised.__cause__
            with transaction() as tx:
                return {t: Counter(tx.rows_of(t)) for t in self.projection.tables}

    def _log_upto(self, upto: Position) -> Iterator[list[Any]]:
        position: Position = (0, 0)
        while position < upto:
            with self.d.reporting_read() as tx:
                rows = tx.all(
                    "select_notifications",
                    {"after_tx": position[0], "after": position[1], "limit": VERIFY_BATCH},
                )
            rows = [r for r in rows if _position(r) <= upto]
            if not rows:
                return
            yield rows
            position = _position(rows[-1])


def tracked_statuses(dialect: ProjectionDialect) -> list[TrackedStatus]:
    """Every tracked projection's position, lag (events of the log after it) and failure."""
    with dialect.reporting_read() as tx:
        tracking = tx.all("select_all_tracking", {})
        failures = {
            r["projection"]: Failure(
                position=(int(r["position_tx"]), int(r["position"])),
                run_id=_uuid(r["run_id"]) if r["run_id"] is not None else None,
                topic=r["topic"],
                error=r["error"],
                failed_at=dialect.py_time(r["failed_at"]),
                attempts=int(r["attempts"]),
            )
            for r in tx.all("select_failures", {})
        }
        positions = {r["projection"]: (int(r["position_tx"]), int(r["position"])) for r in tracking}
        statuses = []
        # A projection that failed before its first batch (its create_tables raised) has a
        # failure but no tracking row yet: it stands at the start.
        for name in sorted(positions.keys() | failures.keys()):
            position = positions.get(name, (0, 0))
            (lag,) = tx.all("count_after", {"after_tx": position[0], "after": position[1]})
            statuses.append(
                TrackedStatus(
                    name=name, position=position, lag=int(lag["n"]), failure=failures.get(name)
                )
            )
    return statuses
