"""The run store on SQLite: the embedded default, zero setup.

Every write is one `BEGIN IMMEDIATE` transaction on the eventsourcing library's SQLite pool,
whose writer lock already lets one thread of this process write at a time; other processes
wait on SQLite's busy timeout. The store's clock is the host's, read once inside the write
lock, so all rows of one commit share the same instant (ADR 0003).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress

from eventsourcing.persistence import PersistenceError
from eventsourcing.sqlite import SQLiteDatastore

from steptrail.domain.errors import StoreUnavailable
from steptrail.infrastructure.sqlfiles import migrations, queries, statements
from steptrail.infrastructure.sqlite_bulk import SQLiteBulk
from steptrail.infrastructure.sqlite_connections import (
    BUSY_TIMEOUT_SECONDS,
    HANDOVER_TIMEOUT_SECONDS,
    SQLITE_HEADER,
    STATEMENT_CACHE,
    SYSTEM_FOLDERS,
    SQLiteTarget,
    _cache_statements,
    _Checkpointer,
    _configure,
    _connect,
    _Handover,
    _raise_store_error,
    _store_error,
    journal_cells,
    journal_from_cells,
    now_us,
    path_from_url,
    target_from_url,
    to_datetime,
    to_us,
)
from steptrail.infrastructure.sqlite_reporting import SQLiteReporting
from steptrail.infrastructure.store_base import (
    LookedPast,
    ReadOnlyStore,
)

__all__ = [
    "BUSY_TIMEOUT_SECONDS",
    "CHECKPOINT_EVERY",
    "HANDOVER_TIMEOUT_SECONDS",
    "SQLITE_HEADER",
    "STATEMENT_CACHE",
    "SYSTEM_FOLDERS",
    "WRITER_AUTOCHECKPOINT",
    "SQLiteRunStore",
    "SQLiteTarget",
    "journal_cells",
    "journal_from_cells",
    "now_us",
    "path_from_url",
    "target_from_url",
    "to_datetime",
    "to_us",
]

# The WAL is checkpointed by a thread of the store's own, outside every write turn (ADR 0061):
# the writer wakes it every CHECKPOINT_EVERY commits (a step append writes ~5 WAL frames, so
# about SQLite's default 1,000 frames). The writer connection still checkpoints by itself past
# WRITER_AUTOCHECKPOINT frames, the backstop when that thread is behind or gone.
CHECKPOINT_EVERY = 200
WRITER_AUTOCHECKPOINT = 4000


# Idle workers of this process sleep on one event per database file; enqueuers set it. Workers
# in other processes cannot be woken this way and poll (SQLite has no LISTEN/NOTIFY).
_WAKERS: dict[str, threading.Event] = {}
_WAKERS_LOCK = threading.Lock()


class _FileWrite:
    """One write transaction on a file database (`SQLiteRunStore._write`): the turn of this
    process (the store's mutex), then of this database (the flock handover), then `BEGIN
    IMMEDIATE` on the store's writer connection, and the store's clock read inside all three.
    Leaving commits, or rolls back if the body raised; either way the turn passes on, in the
    reverse order, and a database error becomes what `_store_error` says."""

    __slots__ = ("_cur", "_handover", "_store")

    def __init__(self, store: SQLiteRunStore) -> None:
        self._store = store

    def __enter__(self) -> tuple[sqlite3.Cursor, int]:
        store = self._store
        handover = store._handover_lock()
        if not store._writer_mutex.acquire(timeout=BUSY_TIMEOUT_SECONDS):
            raise StoreUnavailable(
                f"no turn to write to {store.path} within {BUSY_TIMEOUT_SECONDS} s"
            )
        try:
            handover.acquire()
            try:
                cur = store._writer or store._open_writer()
                cur.execute("BEGIN IMMEDIATE")
            except BaseException:
                handover.release()
                raise
        except (sqlite3.Error, PersistenceError) as e:
            store._writer_mutex.release()
            _raise_store_error(e)
        except BaseException:
            store._writer_mutex.release()
            raise
        self._handover = handover
        self._cur = cur
        return cur, store.now_us()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: object
    ) -> None:
        cur = self._cur
        try:
            if error is None:
                try:
                    cur.execute("COMMIT")
                except BaseException:
                    with suppress(sqlite3.Error):
                        cur.connection.rollback()
                    raise
                store = self._store
                store._commits += 1
                if store._commits >= CHECKPOINT_EVERY:
                    store._commits = 0
                    store._checkpointer.wake()
            else:
                with suppress(sqlite3.Error):
                    cur.connection.rollback()
        except (sqlite3.Error, PersistenceError) as e:  # the COMMIT's (a deferred key)
            _raise_store_error(e)
        finally:
            self._handover.release()
            self._store._writer_mutex.release()
        if isinstance(error, (sqlite3.Error, PersistenceError)):
            translated = _store_error(error)
            if translated is not error:  # else the body's error goes on as it is
                raise translated from error


class SQLiteRunStore(SQLiteBulk, SQLiteReporting):
    """`RunStore` on SQLite. See the module docstring for the write protocol; its parts are
    `sqlite_connections` (plumbing), `sqlite_reads`, `sqlite_claims`, `sqlite_writes`,
    `sqlite_bulk` and `sqlite_reporting`."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        handover_timeout: float = HANDOVER_TIMEOUT_SECONDS,
    ) -> None:
        self.url = url
        target = target_from_url(url)
        self.db_name = target.db_name
        self.path = target.path
        self.read_only = target.read_only
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
        # The writer-lock file is opened on the first write, never by a reader: a read-only
        # database (a read-only mount, ?mode=ro) must serve every read (ADR 0021).
        self._lock_fd: int | None = None
        self._lock_open = threading.Lock()
        self._handover: _Handover | None = None
        # The writer connection of a file database (see _write), and the turn to use it.
        self._writer: sqlite3.Cursor | None = None
        self._writer_mutex = threading.Lock()
        self._handover_timeout = handover_timeout
        self._commits = 0  # since the checkpointer was last woken (under _writer_mutex)
        self._checkpointer = _Checkpointer(self.db_name)
        # Runs unreadable both ways the reaper's scan looks past for a while (ADR 0066).
        self._looked_past = LookedPast()
        with _WAKERS_LOCK:
            self._woken = _WAKERS.setdefault(self.db_name, threading.Event())
        try:
            with self._read() as cur:
                cur.execute("SELECT 1")
        except StoreUnavailable:
            self.datastore.close()
            raise

    # -- plumbing ------------------------------------------------------------------------------

    def _write(self) -> AbstractContextManager[tuple[sqlite3.Cursor, int]]:
        """A cursor in an IMMEDIATE transaction, and the store's clock read inside it.

        Writers of this process take turns on one writer connection (a file database) or on
        the pool's writer lock (an in-memory one, whose pool keeps readers out while it
        writes). Writers of other processes take turns on an flock of a file beside the
        database first: a waiting process sleeps in the kernel and wakes the moment the lock
        is free, where SQLite's own busy handler would poll with sleeps of 1 to 100 ms.
        A file database's turn is a plain context manager class (`_FileWrite`): every step's
        append comes through here, and a generator's context manager cost more than the
        turn's mutex (ADR 0039, ADR 0055).
        """
        if self.path is None:
            return self._write_pooled()
        return _FileWrite(self)

    @contextmanager
    def _write_pooled(self) -> Iterator[tuple[sqlite3.Cursor, int]]:
        """`_write` for an in-memory database: the pool's writer lock is the turn."""
        try:
            with (
                self.datastore.get_connection(commit=True) as pooled,
                pooled.cursor() as cur,
            ):
                _configure(pooled, cur)
                cur.execute("BEGIN IMMEDIATE")
                try:
                    yield cur, self.now_us()
                    cur.execute("COMMIT")
                except BaseException:
                    with suppress(sqlite3.Error):
                        cur.connection.rollback()
                    raise
        except (sqlite3.Error, PersistenceError) as e:
            _raise_store_error(e)

    def _open_writer(self) -> sqlite3.Cursor:
        """Open this store's writer connection (a file database); the caller holds
        `_writer_mutex`. One connection for every write, out of the pool: taking a pooled
        connection and a cursor cost more than a step's SQL (ADR 0039)."""
        conn = _connect(self.db_name, BUSY_TIMEOUT_SECONDS)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA secure_delete=ON")
            conn.execute(f"PRAGMA wal_autocheckpoint={WRITER_AUTOCHECKPOINT}")
        except BaseException:
            conn.close()
            raise
        self._writer = conn.cursor()
        return self._writer

    def _handover_lock(self) -> _Handover:
        """The writer-lock file's handover, opened on the first write (never by a reader: a
        read-only database must serve every read, ADR 0021)."""
        if self.read_only:
            raise ReadOnlyStore(
                f"{self.path} is open read-only (?mode=ro or not writable); nothing was written"
            )
        if self._handover is not None:
            return self._handover
        with self._lock_open:
            if self._handover is None:
                try:
                    self._lock_fd = os.open(
                        f"{self.path}.writer-lock", os.O_RDWR | os.O_CREAT, 0o600
                    )
                except OSError as e:
                    raise ReadOnlyStore(f"cannot write to {self.path}: {e.strerror or e}") from e
                self._handover = _Handover(self._lock_fd, self._handover_timeout)
            return self._handover

    def close(self) -> None:
        self._checkpointer.close()
        with self._writer_mutex:
            if self._writer is not None:
                self._writer.connection.close()
                self._writer = None
        with self._lock_open:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
                self._handover = None
        self.datastore.close()

    # -- schema --------------------------------------------------------------------------------

    def migrate(self, *, upto: int | None = None) -> list[str]:
        """Apply missing migrations (only those numbered `upto` or lower, if given)."""
        applied_now: list[str] = []
        with self._write() as (cur, at):
            cur.execute(self.q["create_migrations_table"])
            cur.execute(self.q["applied_migrations"])
            done = {r["version"] for r in cur.fetchall()}
            for number, name, sql in migrations(self.backend):
                if number in done or (upto is not None and number > upto):
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
