"""The run store on SQLite: the embedded default, zero setup.

Every write is one `BEGIN IMMEDIATE` transaction on the eventsourcing library's SQLite pool,
whose writer lock already lets one thread of this process write at a time; other processes
wait on SQLite's busy timeout. The store's clock is the host's, read once inside the write
lock, so all rows of one commit share the same instant (ADR 0003).
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID, uuid4

from eventsourcing.persistence import InterfaceError, PersistenceError
from eventsourcing.sqlite import SQLiteConnection, SQLiteConnectionPool, SQLiteDatastore

from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.domain.journal import JournalEntry
from steptrail.domain.ports import ClaimedRun, RecordedEvent
from steptrail.domain.run import Run, RunEvent
from steptrail.infrastructure.codec import decode_event, encode_event
from steptrail.infrastructure.sqlfiles import migrations, queries, statements
from steptrail.infrastructure.store_base import (
    REQUEST,
    RESUMABLE,
    ClaimsOne,
    encoded_events,
    journal_from_rows,
    journal_rows,
    run_from_row,
    side_effects,
    state_params,
)
from steptrail.projections.run_index import RunRow, rebuild_rows

BUSY_TIMEOUT_SECONDS = 30
STATEMENT_CACHE = 64  # prepared statements kept per connection
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Idle workers of this process sleep on one event per database file; enqueuers set it. Workers
# in other processes cannot be woken this way and poll (SQLite has no LISTEN/NOTIFY).
_WAKERS: dict[str, threading.Event] = {}
_WAKERS_LOCK = threading.Lock()


def path_from_url(url: str) -> str:
    """The database name the eventsourcing SQLite pool wants for a `sqlite:///` URL."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ValueError(f"not a SQLite URL: {url!r}")
    path = parts.path[1:] if parts.path.startswith("/") and not parts.netloc else parts.path
    if parts.netloc:
        raise ValueError(
            f"a SQLite URL has no host; use sqlite:///relative or sqlite:////abs: {url!r}"
        )
    if path in ("", ":memory:"):
        # A private shared-cache database: every connection of this store sees the same one.
        return f"file:steptrail-{uuid4().hex}?mode=memory&cache=shared"
    folder = Path(path).expanduser().resolve().parent
    if not folder.is_dir():
        raise ValueError(f"the folder of the SQLite database does not exist: {folder}")
    return str(Path(path).expanduser())


def _configure(conn: object, cur: sqlite3.Cursor) -> None:
    """Connection settings, applied once per pooled connection (outside any transaction).

    * synchronous=NORMAL in WAL mode: a commit survives the process being killed (what a
      worker crash is); only an OS crash may lose the latest commits.
    * foreign_keys=ON: events must belong to a run in the index (migration 0003); SQLite
      checks foreign keys only on connections that ask.
    * secure_delete=ON: deleted content (settled runs' saved requests and resumable state,
      purged runs) is overwritten in the file, not just unlinked.
    """
    if getattr(conn, "_steptrail_configured", False):
        return
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA secure_delete=ON")
    conn._steptrail_configured = True  # type: ignore[attr-defined]


def _cache_statements(pool: SQLiteConnectionPool) -> None:
    """Make the pool's new connections keep their prepared statements.

    The eventsourcing pool opens connections with `cached_statements=True`, a statement
    cache of size 1: every statement of an append alternating with another is parsed and
    planned again, tens of microseconds each, which made each statement added to an append
    (the step journal's insert) cost as much as the write itself. Same connection settings
    otherwise (autocommit, WAL, rows by name).
    """

    def create() -> SQLiteConnection:
        try:
            raw = sqlite3.connect(
                database=pool.db_name,
                uri=True,
                check_same_thread=False,
                isolation_level=None,
                cached_statements=STATEMENT_CACHE,
                timeout=pool.lock_timeout or BUSY_TIMEOUT_SECONDS,
            )
        except (sqlite3.Error, TypeError) as e:
            raise InterfaceError(e) from e
        if not pool.is_sqlite_memory_mode and not pool.is_journal_mode_wal:
            raw.execute("PRAGMA journal_mode=WAL")
            pool.is_journal_mode_wal = True
        raw.row_factory = sqlite3.Row
        return SQLiteConnection(sqlite_conn=raw, max_age=pool.max_age)

    pool._create_connection = create  # type: ignore[method-assign]


def now_us() -> int:
    return time.time_ns() // 1000


def to_datetime(us: int | None) -> datetime | None:
    if us is None:
        return None
    return _EPOCH + timedelta(microseconds=us)


def to_us(value: datetime | None) -> int | None:
    if value is None:
        return None
    delta = value.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


class SQLiteRunStore(ClaimsOne):
    """`RunStore` on SQLite. See the module docstring for the write protocol."""

    backend = "sqlite"

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        self.url = url
        self.db_name = path_from_url(url)
        self.datastore = SQLiteDatastore(
            self.db_name,
            lock_timeout=BUSY_TIMEOUT_SECONDS,
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_timeout=BUSY_TIMEOUT_SECONDS,
        )
        _cache_statements(self.datastore.pool)
        self.q = queries(self.backend)
        # Microseconds added to the host's clock; only the testing kit's time skipping sets
        # it (steptrail.testing, ADR 0034). Production never does: it reads the host's clock.
        self.clock_offset_us = 0
        self._lock_fd: int | None = None
        if not self.db_name.startswith("file:"):
            self._lock_fd = os.open(f"{self.db_name}.writer-lock", os.O_RDWR | os.O_CREAT, 0o600)
        with _WAKERS_LOCK:
            self._woken = _WAKERS.setdefault(self.db_name, threading.Event())
        try:
            with self._read() as cur:
                cur.execute("SELECT 1")
        except StoreUnavailable:
            self.datastore.close()
            raise

    # -- plumbing ------------------------------------------------------------------------------

    def now_us(self) -> int:
        """The store's clock: the host's, plus the testing kit's skipped time (if any)."""
        return now_us() + self.clock_offset_us

    @contextmanager
    def _write(self) -> Iterator[tuple[sqlite3.Cursor, int]]:
        """A cursor in an IMMEDIATE transaction, and the store's clock read inside it.

        Writers of this process take turns on the pool's writer lock. Writers of other
        processes take turns on an flock of a file beside the database first: a waiting
        process sleeps in the kernel and wakes the moment the lock is free, where SQLite's
        own busy handler would poll with sleeps of 1 to 100 ms.
        """
        try:
            with (
                self.datastore.get_connection(commit=True) as conn,
                self._process_lock(),
                conn.cursor() as cur,
            ):
                _configure(conn, cur)
                cur.execute("BEGIN IMMEDIATE")
                try:
                    yield cur, self.now_us()
                    conn.commit()
                except BaseException:
                    with suppress(sqlite3.Error):
                        conn.rollback()
                    raise
        except sqlite3.IntegrityError as e:
            if "steptrail_events" in str(e):
                raise VersionConflict("somebody appended to the run first") from e
            if "FOREIGN KEY" in str(e):
                raise VersionConflict("the run no longer exists (purged)") from e
            raise
        except (sqlite3.OperationalError, PersistenceError) as e:
            raise StoreUnavailable(str(e)) from e

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Cursor]:
        try:
            with self.datastore.get_connection(commit=False) as conn, conn.cursor() as cur:
                yield cur
        except (sqlite3.OperationalError, PersistenceError) as e:
            raise StoreUnavailable(str(e)) from e

    @contextmanager
    def _process_lock(self) -> Iterator[None]:
        if self._lock_fd is None:
            yield
            return
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.datastore.close()

    # -- schema --------------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        applied_now: list[str] = []
        with self._write() as (cur, at):
            cur.execute(self.q["create_migrations_table"])
            cur.execute(self.q["applied_migrations"])
            done = {r["version"] for r in cur.fetchall()}
            for number, name, sql in migrations(self.backend):
                if number in done:
                    continue
                # executescript would COMMIT our transaction; run statement by statement.
                for statement in statements(sql):
                    cur.execute(statement)
                cur.execute(self.q["record_migration"], {"version": number, "name": name, "at": at})
                applied_now.append(f"{number:04d}_{name}")
        return applied_now

    def pending_migrations(self) -> list[str]:
        with self._read() as cur:
            cur.execute(
                "SELECT name FROM sqlite_master WHERE type='table' "
                "AND name='steptrail_schema_migrations'"
            )
            done: set[int] = set()
            if cur.fetchone() is not None:
                cur.execute(self.q["applied_migrations"])
                done = {r["version"] for r in cur.fetchall()}
        return [f"{n:04d}_{name}" for n, name, _ in migrations(self.backend) if n not in done]

    # -- writes --------------------------------------------------------------------------------

    @staticmethod
    def _params(run: Run, at: int) -> dict[str, Any]:
        params = state_params(run.state)
        params["run_id"] = run.id.hex
        params["doc"] = json.dumps(params["doc"], separators=(",", ":"))
        params["at"] = at
        return params

    def _insert_events(self, cur: sqlite3.Cursor, run: Run, at: int) -> None:
        cur.executemany(self.q["insert_events"], self._event_params(run, at))

    @staticmethod
    def _event_params(run: Run, at: int) -> list[dict[str, Any]]:
        return [
            {"id": run.id.hex, "version": v, "topic": t, "state": s, "at": at}
            for v, t, s in encoded_events(run)
        ]

    def create(self, run: Run, *, request: bytes | None) -> Run:
        with self._write() as (cur, at):
            if run.state.idempotency_key is not None:
                cur.execute(
                    self.q["select_run_by_key"], {"idempotency_key": run.state.idempotency_key}
                )
                existing = cur.fetchone()
                if existing is not None:
                    return run_from_row(existing)
            self._insert_events(cur, run, at)
            cur.execute(self.q["insert_run"], self._params(run, at))
            if request is not None:
                cur.execute(
                    self.q["put_saved"], {"run_id": run.id.hex, "kind": REQUEST, "body": request}
                )
        run.mark_committed()
        self._wake_if_queued(run)
        return run

    def append(self, run: Run, *, resumable: bytes | None = None) -> None:
        if not run.pending_events:
            return
        # Everything is encoded before the write lock is taken; inside it only SQL runs.
        events = self._event_params(run, 0)
        params = self._params(run, 0)
        drop, _ = side_effects(run.state)
        run_hex = run.id.hex
        # Positional, not named: this statement runs with every step, and binding by name
        # costs a lookup per column.
        journal = [
            (run_hex, r["seq"], r["position"], r["kind"], r["name"], r["fingerprint"], r["outcome"])
            for r in journal_rows(run)
        ]
        with self._write() as (cur, at):
            for event in events:
                event["at"] = at
            params["at"] = at
            cur.executemany(self.q["insert_events"], events)
            cur.execute(self.q["update_run"], params)
            if len(journal) == 1:
                cur.execute(self.q["insert_journal"], journal[0])
            elif journal:
                cur.executemany(self.q["insert_journal"], journal)
            if resumable is not None:
                cur.execute(
                    self.q["put_saved"],
                    {"run_id": run.id.hex, "kind": RESUMABLE, "body": resumable},
                )
            if drop:
                cur.execute(self.q["drop_saved"], {"run_id": run.id.hex})
                cur.execute(self.q["drop_journal"], {"run_id": run.id.hex})
        run.mark_committed()
        self._wake_if_queued(run)

    def claim_batch(
        self, *, holder: str, lease_ms: int, agents: Sequence[str], limit: int
    ) -> list[ClaimedRun]:
        topic, state = encode_event(Run.Claimed(actor=holder, lease_ms=lease_ms))
        candidates = {"agents": json.dumps(list(agents)), "limit": limit}
        with self._write() as (cur, at):
            cur.execute(self.q["claim"], {**candidates, "now": at})
            rows = cur.fetchall()
            if rows:
                cur.executemany(
                    self.q["insert_events"],
                    [
                        {
                            "id": r["run_id"],
                            "version": r["version"] + 1,
                            "topic": topic,
                            "state": state,
                            "at": at,
                        }
                        for r in rows
                    ],
                )
                cur.executemany(
                    self.q["claim_rows"],
                    [
                        {"run_id": r["run_id"], "holder": holder, "lease_ms": lease_ms, "at": at}
                        for r in rows
                    ],
                )
        claimed = []
        for row in rows:
            # The same Claimed fold the SQL just applied, done here outside the write lock.
            run = run_from_row(row)
            run.claim(holder=holder, lease_ms=lease_ms)
            run.mark_committed()
            claimed.append(ClaimedRun(run=run, request=bytes(row["request"] or b"")))
        return claimed

    # -- reads ---------------------------------------------------------------------------------

    def _one(self, name: str, params: dict[str, Any]) -> sqlite3.Row | None:
        with self._read() as cur:
            cur.execute(self.q[name], params)
            row: sqlite3.Row | None = cur.fetchone()
            return row

    def load(self, run_id: UUID) -> Run | None:
        row = self._one("select_run", {"run_id": run_id.hex})
        return run_from_row(row) if row is not None else None

    def row(self, run_id: UUID) -> RunRow | None:
        row = self._one("select_run", {"run_id": run_id.hex})
        return _index_row(row) if row is not None else None

    def saved(self, run_id: UUID, kind: str) -> bytes | None:
        row = self._one("select_saved", {"run_id": run_id.hex, "kind": kind})
        return bytes(row["body"]) if row is not None else None

    def request(self, run_id: UUID) -> bytes | None:
        return self.saved(run_id, REQUEST)

    def journal(self, run_id: UUID) -> list[JournalEntry]:
        with self._read() as cur:
            cur.execute(self.q["select_journal"], {"run_id": run_id.hex})
            return journal_from_rows(cur.fetchall())

    def stale(self, limit: int) -> list[Run]:
        with self._read() as cur:
            cur.execute(self.q["select_stale"], {"now": self.now_us(), "limit": limit})
            return [run_from_row(r) for r in cur.fetchall()]

    def history(self, run_id: UUID) -> list[RecordedEvent]:
        with self._read() as cur:
            cur.execute(self.q["select_history"], {"run_id": run_id.hex})
            rows = cur.fetchall()
        return [
            RecordedEvent(
                run_id=run_id,
                version=r["version"],
                recorded_at=to_datetime(r["recorded_at"]) or datetime.now(UTC),
                event=decode_event(r["topic"], bytes(r["state"])),
                notification_id=r["notification_id"],
            )
            for r in rows
        ]

    def list_rows(
        self, *, status: str | None, agent: str | None, reason: str | None, limit: int
    ) -> list[RunRow]:
        params = {"status": status, "agent": agent, "reason": reason, "limit": limit}
        with self._read() as cur:
            cur.execute(self.q["select_runs"], params)
            return [_index_row(r) for r in cur.fetchall()]

    def all_rows(self) -> list[RunRow]:
        with self._read() as cur:
            cur.execute(self.q["select_all_runs"])
            return [_index_row(r) for r in cur.fetchall()]

    def iter_log(self) -> Iterator[tuple[UUID, RunEvent, datetime]]:
        with self._read() as cur:
            yield from self._log(cur)

    def _log(self, cur: sqlite3.Cursor) -> Iterator[tuple[UUID, RunEvent, datetime]]:
        cur.execute(self.q["select_log"])
        while batch := cur.fetchmany(2000):
            for r in batch:
                at = to_datetime(r["recorded_at"])
                assert at is not None
                yield UUID(r["run_id"]), decode_event(r["topic"], bytes(r["state"])), at

    def rebuild_index(self, progress: Callable[[int], None] | None = None) -> int:
        """Replace the run index with one folded from the log, under the write lock."""
        count = 0
        with self._write() as (cur, _):
            reader = cur.connection.cursor()
            cur.execute(self.q["delete_all_runs"])
            chunk: list[dict[str, Any]] = []
            for row in rebuild_rows(self._log(reader)):
                chunk.append(self._row_params(row))
                count += 1
                if len(chunk) >= 1000:
                    cur.executemany(self.q["insert_row"], chunk)
                    chunk = []
                    if progress is not None:
                        progress(count)
            if chunk:
                cur.executemany(self.q["insert_row"], chunk)
        if progress is not None:
            progress(count)
        return count

    @staticmethod
    def _row_params(row: RunRow) -> dict[str, Any]:
        params = state_params(row.state)
        params["run_id"] = row.state.run_id.hex
        params["doc"] = json.dumps(params["doc"], separators=(",", ":"))
        params.update(
            lease_expires_at=to_us(row.lease_expires_at),
            available_at=to_us(row.available_at),
            created_at=to_us(row.created_at),
            updated_at=to_us(row.updated_at),
        )
        return params

    def store_now(self) -> datetime:
        return to_datetime(self.now_us()) or datetime.now(UTC)

    # -- retention -------------------------------------------------------------------------------

    def count_purgeable(self, *, statuses: Sequence[str], cutoff: datetime) -> int:
        row = self._one(
            "count_purgeable", {"statuses": json.dumps(list(statuses)), "cutoff": to_us(cutoff)}
        )
        return int(row["n"]) if row is not None else 0

    def purge_batch(
        self, *, category: str, statuses: Sequence[str], cutoff: datetime, limit: int
    ) -> list[UUID]:
        """Remove up to `limit` runs due for purging, everywhere, in one transaction; deleted
        content is overwritten (secure_delete) so it does not linger in the file."""
        with self._write() as (cur, at):
            cur.execute(
                self.q["select_purgeable"],
                {"statuses": json.dumps(list(statuses)), "cutoff": to_us(cutoff), "limit": limit},
            )
            ids = [UUID(r["run_id"]) for r in cur.fetchall()]
            if ids:
                params = {"ids": json.dumps([i.hex for i in ids]), "category": category, "now": at}
                for statement in statements(self.q["purge_runs"]):
                    cur.execute(statement, params)
        return ids

    def after_purge(self) -> None:
        """Fold the WAL back into the database so deleted content leaves the WAL file too."""
        with self.datastore.get_connection(commit=True) as conn, conn.cursor() as cur:
            cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def tombstone(self, run_id: UUID) -> tuple[str, datetime] | None:
        row = self._one("select_tombstone", {"run_id": run_id.hex})
        if row is None:
            return None
        return row["category"], to_datetime(row["purged_at"]) or datetime.now(UTC)

    # -- reporting views (the Dialect of reporting_store) ---------------------------------------

    @contextmanager
    def reporting_write(self) -> Iterator[_SqliteTx]:
        with self._write() as (cur, _):
            yield _SqliteTx(cur, self.q)

    @contextmanager
    def reporting_read(self) -> Iterator[_SqliteTx]:
        with self._read() as cur:
            yield _SqliteTx(cur, self.q)

    @staticmethod
    def db_id(value: UUID) -> Any:
        return value.hex

    @staticmethod
    def db_ids(values: Sequence[UUID]) -> Any:
        return json.dumps([v.hex for v in values])

    @staticmethod
    def db_time(value: datetime | None) -> Any:
        return to_us(value)

    @staticmethod
    def py_time(value: Any) -> datetime | None:
        return to_datetime(value)

    @staticmethod
    def db_json(value: Any) -> Any:
        return json.dumps(value, separators=(",", ":"))

    def db_now(self) -> Any:
        return self.now_us()

    # -- waking idle workers -------------------------------------------------------------------

    def _wake_if_queued(self, run: Run) -> None:
        if side_effects(run.state)[1]:
            self._woken.set()

    def wait_for_work(self, timeout: float) -> None:
        self._woken.wait(timeout)
        self._woken.clear()

    def wake(self) -> None:
        self._woken.set()


class _SqliteTx:
    """Named queries on one cursor (inside an IMMEDIATE transaction when writing)."""

    def __init__(self, cur: sqlite3.Cursor, q: dict[str, str]) -> None:
        self.cur = cur
        self.q = q

    def all(self, name: str, params: Mapping[str, Any]) -> list[Any]:
        return self.cur.execute(self.q[name], dict(params)).fetchall()

    def run(self, name: str, params: Mapping[str, Any]) -> None:
        for statement in statements(self.q[name]):
            self.cur.execute(statement, dict(params))

    def many(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        if params:
            self.cur.executemany(self.q[name], [dict(p) for p in params])


def _index_row(row: sqlite3.Row) -> RunRow:
    return RunRow(
        state=run_from_row(row).state,
        created_at=to_datetime(row["created_at"]) or datetime.now(UTC),
        updated_at=to_datetime(row["updated_at"]) or datetime.now(UTC),
        lease_expires_at=to_datetime(row["lease_expires_at"]),
        available_at=to_datetime(row["available_at"]),
    )
