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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qs, quote, urlsplit
from uuid import UUID, uuid4

from eventsourcing.persistence import InterfaceError, PersistenceError
from eventsourcing.sqlite import SQLiteConnection, SQLiteConnectionPool, SQLiteDatastore

from steptrail.domain.children import settles_child
from steptrail.domain.enums import RunStatus
from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.domain.journal import JournalEntry
from steptrail.domain.ports import ClaimedRun, ClaimRequest, RecordedEvent
from steptrail.domain.run import Run, RunEvent, RunState
from steptrail.domain.waits import SignalGuard
from steptrail.infrastructure.children_store import SQLiteChildren
from steptrail.infrastructure.codec import decode_event, encode_event
from steptrail.infrastructure.rate_limits_store import SQLiteRateLimits
from steptrail.infrastructure.run_ids import SQLiteRunIds
from steptrail.infrastructure.schedules_store import SQLiteSchedules
from steptrail.infrastructure.sqlfiles import migrations, queries, statements
from steptrail.infrastructure.sqlite_keys import held_back
from steptrail.infrastructure.sqlite_queues import pick as pick_claimable
from steptrail.infrastructure.sqlite_signals import SQLiteSignals
from steptrail.infrastructure.sqlite_wake import SQLiteWake
from steptrail.infrastructure.store_base import (
    FIRST_ID,
    RANGE_RUNS,
    REBUILD_RANGE,
    REQUEST,
    RESUMABLE,
    ClaimsOne,
    LookedPast,
    ReadOnlyStore,
    after,
    claimed_event,
    encoded_events,
    journal_cut,
    keeps_request,
    listing_query,
    pending_entries,
    range_end,
    readable_run,
    run_from_row,
    settled_load,
    side_effects,
    skip_unreadable,
    split_unreadable,
    state_params,
)
from steptrail.infrastructure.user_sql import SqliteSql, sqlite_drop, sqlite_rows_of
from steptrail.projections.custom import PurgeHook
from steptrail.projections.run_index import (
    IndexRange,
    RunRow,
    claimable_after_ms,
    column_values,
    document_json,
    document_only,
    rebuild_rows,
)

BUSY_TIMEOUT_SECONDS = 30
# How long a writer waits for another process's turn on the database before it gives up as
# on any store error (its segment retries, then fences itself). Short against a lease: a
# stopped process holding the turn must not freeze every writer with it (ADR 0016).
HANDOVER_TIMEOUT_SECONDS = 5.0
STATEMENT_CACHE = 64  # prepared statements kept per connection
# The WAL is checkpointed by a thread of the store's own, outside every write turn (ADR 0061):
# the writer wakes it every CHECKPOINT_EVERY commits (a step append writes ~5 WAL frames, so
# about SQLite's default 1,000 frames). The writer connection still checkpoints by itself past
# WRITER_AUTOCHECKPOINT frames, the backstop when that thread is behind or gone.
CHECKPOINT_EVERY = 200
WRITER_AUTOCHECKPOINT = 4000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Idle workers of this process sleep on one event per database file; enqueuers set it. Workers
# in other processes cannot be woken this way and poll (SQLite has no LISTEN/NOTIFY).
_WAKERS: dict[str, threading.Event] = {}
_WAKERS_LOCK = threading.Lock()


SYSTEM_FOLDERS = (
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/boot",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/usr",
)
SQLITE_HEADER = b"SQLite format 3\x00"


@dataclass(frozen=True)
class SQLiteTarget:
    """Where a `sqlite:` URL points: the name for the connection pool, the file (None for a
    private in-memory database) and whether to open it read-only."""

    db_name: str
    path: Path | None
    read_only: bool


def path_from_url(url: str) -> str:
    """The database name the eventsourcing SQLite pool wants for a `sqlite:///` URL."""
    return target_from_url(url).db_name


def target_from_url(url: str) -> SQLiteTarget:
    """Check a `sqlite:` URL and say how to open it (ADR 0021).

    `sqlite:///relative.db`, `sqlite:////absolute.db`, `sqlite:///:memory:` (a private
    in-memory database, for tests and trials), and `?mode=ro` to open a file read-only. A
    file that exists but is not writable (a read-only mount) is opened read-only too.

    Raises:
        ValueError: no file named (`sqlite://`, `sqlite:///`), a host, an unknown query, a
            missing folder, a system folder, or an existing file that is not SQLite.
    """
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ValueError(f"not a SQLite URL: {url!r}")
    if parts.netloc:
        raise ValueError(
            f"a SQLite URL has no host; use sqlite:///relative or sqlite:////abs: {url!r}"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    query = parse_qs(parts.query, keep_blank_values=True)
    if set(query) - {"mode"} or query.get("mode", ["ro"]) != ["ro"]:
        raise ValueError(f"a SQLite URL takes only ?mode=ro, not ?{parts.query}")
    mode_ro = "mode" in query
    if path == "":
        raise ValueError(
            f"{url!r} names no database file: use sqlite:///path.db "
            "(or sqlite:///:memory: for a private in-memory database)"
        )
    if path == ":memory:":
        # A private shared-cache database: every connection of this store sees the same one.
        return SQLiteTarget(f"file:steptrail-{uuid4().hex}?mode=memory&cache=shared", None, False)
    file = Path(path).expanduser()
    resolved = file.resolve()
    _check_file(resolved, url, mode_ro=mode_ro)
    folder_writable = os.access(resolved.parent, os.W_OK)
    writable = not resolved.exists() or (os.access(resolved, os.W_OK) and folder_writable)
    if not folder_writable and resolved.exists():
        # A read-only folder (a read-only mount): SQLite cannot create the WAL index beside
        # the file, so the file is opened as immutable; nobody can write it from here anyway.
        return SQLiteTarget(f"file:{quote(str(resolved))}?mode=ro&immutable=1", resolved, True)
    if mode_ro or not writable:
        return SQLiteTarget(f"file:{quote(str(resolved))}?mode=ro", resolved, True)
    return SQLiteTarget(str(file), resolved, False)


def _check_file(resolved: Path, url: str, *, mode_ro: bool) -> None:
    """Refuse system folders, missing folders and existing files that are not SQLite."""
    for folder in SYSTEM_FOLDERS:
        if resolved == Path(folder) or resolved.is_relative_to(folder):
            raise ValueError(f"refusing a SQLite database in the system folder {folder}: {url!r}")
    if not resolved.parent.is_dir():
        raise ValueError(f"the folder of the SQLite database does not exist: {resolved.parent}")
    if resolved.exists():
        if not resolved.is_file():
            raise ValueError(f"not a file: {resolved}")
        with suppress(OSError), resolved.open("rb") as handle:
            head = handle.read(len(SQLITE_HEADER))
            if head and head != SQLITE_HEADER:
                raise ValueError(f"not a SQLite database: {resolved}")
    elif mode_ro:
        raise ValueError(f"no SQLite database to open read-only at {resolved}")


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


class _Handover:
    """The flock that hands the database from one writing process to the next, bounded.

    Uncontended, it is one non-blocking flock call. Contended, one helper thread per store
    waits in the kernel (so the lock passes the moment it is free, with no polling) while the
    writer waits for it at most `timeout`; a writer that gives up raises StoreUnavailable, and
    a lock the helper gets with nobody left waiting is let go at once. One helper at most, so
    a process stopped while holding the lock costs one blocked thread, not one per attempt.
    """

    def __init__(self, fd: int, timeout: float) -> None:
        self.fd = fd
        self.timeout = timeout
        self._cond = threading.Condition()
        self._helper_waiting = False  # a helper thread is blocked in flock
        self._granted = False  # the helper holds the lock for a writer to take
        self._writers = 0  # writers waiting on the helper

    def acquire(self) -> None:
        # Writers of this process reach this one at a time (the pool's writer lock), which
        # matters: flock is per open file, so a second thread of ours would not be kept out.
        deadline = time.monotonic() + self.timeout
        with self._cond:
            if not self._helper_waiting:
                # No helper is blocked in flock (it would get the lock we take here and
                # hand it on): the fast path is safe.
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass
                else:
                    return
                self._helper_waiting = True
                threading.Thread(
                    target=self._wait, name="steptrail-sqlite-handover", daemon=True
                ).start()
            self._writers += 1
            try:
                while not self._granted:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise StoreUnavailable(
                            "another process has held the SQLite write lock for over "
                            f"{self.timeout:g} s (stopped or stuck?)"
                        )
                    self._cond.wait(remaining)
                self._granted = False  # ours now
            finally:
                self._writers -= 1

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _wait(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        with self._cond:
            self._helper_waiting = False
            if self._writers == 0:  # everybody gave up meanwhile: pass it on
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                return
            self._granted = True
            self._cond.notify()


class _Checkpointer:
    """Checkpoints a file database's WAL from a thread of its own (ADR 0061).

    SQLite checkpoints on the connection that commits, inside that commit: with the default
    threshold one step append in 200 stalled for milliseconds, in the write turn, holding up
    every writer of every process (17 to 18 % of a step-append loop, ADR 0055). Here the writer
    only wakes this thread; a PASSIVE checkpoint copies the WAL's frames into the database
    file without taking the write lock, and the next writer starts the WAL over. Best effort:
    a checkpoint that fails (another process checkpointing, a reader in the way) waits for
    the next wake-up, and the writer's own backstop threshold bounds the WAL meanwhile.

    The thread starts on the first wake-up, and again after a fork (the child has none) or
    if it died; `close` stops it and closes its connection.
    """

    def __init__(self, db_name: str) -> None:
        self._db_name = db_name
        self._wanted = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.done = 0  # checkpoints run (tests and curiosity)

    def wake(self) -> None:
        """Ask for a checkpoint soon. Called by the writer, under the store's writer mutex."""
        if self._closed:
            return
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name="steptrail-sqlite-checkpoint", daemon=True
            )
            self._thread.start()
        self._wanted.set()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self._closed or self._thread is not threading.current_thread():
                    return  # closed, or replaced (wake() found this thread gone)
                try:
                    if conn is None:
                        conn = _connect(self._db_name, 0)
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.done += 1
                except sqlite3.Error:
                    pass  # busy or gone: the next wake-up tries again; the backstop holds
        finally:
            if conn is not None:
                conn.close()

    def close(self) -> None:
        self._closed = True
        self._wanted.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=BUSY_TIMEOUT_SECONDS)


def _connect(db_name: str, timeout: float) -> sqlite3.Connection:
    """A connection as the store wants every one: autocommit (transactions are explicit),
    rows by name, and a statement cache that holds every statement of a write."""
    raw = sqlite3.connect(
        database=db_name,
        uri=True,
        check_same_thread=False,
        isolation_level=None,
        cached_statements=STATEMENT_CACHE,
        timeout=timeout,
    )
    raw.row_factory = sqlite3.Row
    return raw


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
            raw = _connect(pool.db_name, pool.lock_timeout or BUSY_TIMEOUT_SECONDS)
        except (sqlite3.Error, TypeError) as e:
            raise InterfaceError(e) from e
        if not pool.is_sqlite_memory_mode and not pool.is_journal_mode_wal:
            raw.execute("PRAGMA journal_mode=WAL")
            pool.is_journal_mode_wal = True
        return SQLiteConnection(sqlite_conn=raw, max_age=pool.max_age)

    pool._create_connection = create  # type: ignore[method-assign]


def _hex(run_id: UUID | None) -> str | None:
    return run_id.hex if run_id is not None else None


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


# One string encoder, built once (json.dumps with options builds one per call).
_STR = json.JSONEncoder(ensure_ascii=False).encode


def journal_cells(run: Run) -> dict[int, bytes]:
    """The journal entries to write with `run`'s pending events, by step seq, in the form
    the event row's `journal` column holds them (ADR 0050): one JSON array
    `[seq, position, kind, name, fingerprint, outcome]`, the outcome as encoded."""
    return {
        seq: b"[%d,%d,%s,%s,%s,%s]"
        % (
            seq,
            e.position,
            _STR(e.kind).encode(),
            _STR(e.name).encode(),
            _STR(e.fingerprint).encode(),
            e.outcome(),
        )
        for seq, e in pending_entries(run)
    }


def journal_from_cells(cells: Iterable[bytes | str]) -> list[JournalEntry]:
    """The journal entries the `journal` column of a run's events holds, in step order."""
    entries = []
    for cell in cells:
        seq, position, kind, name, fingerprint, body = json.loads(cell)
        entries.append(
            JournalEntry.from_body(
                seq=seq, position=position, kind=kind, name=name, fingerprint=fingerprint, body=body
            )
        )
    return sorted(entries, key=lambda e: e.seq)


def _store_error(error: sqlite3.Error | PersistenceError) -> Exception:
    """What a write that failed with `error` raises: a conflict for the fence (the events'
    unique key, or the deferred foreign key of a purged run), unavailable for a database
    that could not be written (busy, locked, gone), else the error itself."""
    if isinstance(error, sqlite3.IntegrityError):
        if "steptrail_events" in str(error):
            return VersionConflict("somebody appended to the run first")
        if "FOREIGN KEY" in str(error):
            return VersionConflict("the run no longer exists (purged)")
        return error
    if isinstance(error, (sqlite3.OperationalError, PersistenceError)):
        return StoreUnavailable(str(error))
    return error


def _raise_store_error(error: sqlite3.Error | PersistenceError) -> NoReturn:
    """Raise what `_store_error` makes of `error` (from it), or `error` itself."""
    translated = _store_error(error)
    if translated is error:
        raise error
    raise translated from error


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


@dataclass(slots=True)
class _PreparedAppend:
    """An append encoded outside the write lock: what `_write_append` writes inside it."""

    run: Run
    run_hex: str
    state: RunState
    doc: str
    params: dict[str, Any] | None
    events: list[tuple[Any, ...]]
    resumable: bytes | None
    drop: bool
    wake: bool


class SQLiteRunStore(
    SQLiteRunIds,
    SQLiteSchedules,
    SQLiteRateLimits,
    SQLiteSignals,
    SQLiteChildren,
    SQLiteWake,
    ClaimsOne,
):
    """`RunStore` on SQLite. See the module docstring for the write protocol."""

    backend = "sqlite"

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

    def now_us(self) -> int:
        """The store's clock: the host's, plus the testing kit's skipped time (if any)."""
        return now_us() + self.clock_offset_us

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

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Cursor]:
        try:
            with self.datastore.get_connection(commit=False) as conn, conn.cursor() as cur:
                yield cur
        except (sqlite3.OperationalError, PersistenceError) as e:
            raise StoreUnavailable(str(e)) from e

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

    # -- writes --------------------------------------------------------------------------------

    @staticmethod
    def _params(run: Run, at: int) -> dict[str, Any]:
        params = state_params(run.state)
        params["run_id"] = run.id.hex
        params["parent_id"] = _hex(run.state.parent_id)
        params["doc"] = document_json(run.state)
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
        existing: sqlite3.Row | None = None
        with self._write() as (cur, at):
            if run.state.idempotency_key is not None:
                cur.execute(
                    self.q["select_run_by_key"], {"idempotency_key": run.state.idempotency_key}
                )
                existing = cur.fetchone()
            if existing is None:
                self._insert_events(cur, run, at)
                cur.execute(self.q["insert_run"], self._params(run, at))
                if request is not None:
                    params = {"run_id": run.id.hex, "kind": REQUEST, "body": request}
                    cur.execute(self.q["put_saved"], params)
        if existing is not None:
            # Decoded outside the write: a row read from the log instead (ADR 0066) reads
            # on a connection of its own.
            return self._run(existing)
        run.mark_committed()
        self._wake_if_queued(run)
        return run

    def create_many(self, runs: Sequence[tuple[Run, bytes | None]]) -> list[UUID]:
        """Record many new runs in one IMMEDIATE transaction; see `RunStore.create_many`."""
        if not runs:
            return []
        keys = [r.state.idempotency_key for r, _ in runs if r.state.idempotency_key is not None]
        # Encoded before the write lock; the instant is filled in inside it.
        rows = [
            (run, self._params(run, 0), self._event_params(run, 0), request)
            for run, request in runs
        ]
        stored: list[UUID] = []
        inserted: list[Run] = []
        with self._write() as (cur, at):
            taken: dict[str, UUID] = {}
            if keys:
                cur.execute(self.q["select_runs_by_keys"], {"keys": json.dumps(keys)})
                taken = {r["idempotency_key"]: UUID(r["run_id"]) for r in cur.fetchall()}
            events: list[dict[str, Any]] = []
            index: list[dict[str, Any]] = []
            requests: list[dict[str, Any]] = []
            for run, params, run_events, request in rows:
                key = run.state.idempotency_key
                if key is not None and key in taken:
                    stored.append(taken[key])
                    continue
                if key is not None:
                    taken[key] = run.id  # a later run of this batch with the key gets this one
                params["at"] = at
                for event in run_events:
                    event["at"] = at
                events += run_events
                index.append(params)
                if request is not None:
                    requests.append({"run_id": run.id.hex, "kind": REQUEST, "body": request})
                stored.append(run.id)
                inserted.append(run)
            cur.executemany(self.q["insert_events"], events)
            cur.executemany(self.q["insert_run"], index)
            cur.executemany(self.q["put_saved"], requests)
        for run in inserted:
            run.mark_committed()
        if any(side_effects(run.state)[1] for run in inserted):
            self._woken.set()
        return stored

    def bulk_load_settled(self, runs: Sequence[tuple[Run, datetime, bytes | None]]) -> int:
        """Write whole settled runs in one transaction: for loading benchmark databases only
        (bench/scale.py; ADR 0044), never a live one. Each item is a new run whose pending
        events take it from creation to settlement, the instant of its first event, and the
        request it keeps (failed runs keep theirs, ADR 0025; None otherwise). Writes the log
        (events `LOAD_SPACING` apart), the index row as `rebuild` folds it, and the kept
        request; no fence, no idempotency check, no wake-up, and the reporting views are
        left to the projector. Returns the number of runs written."""
        events: list[dict[str, Any]] = []
        rows: list[dict[str, Any]] = []
        requests: list[dict[str, Any]] = []
        for run, at, request in runs:
            log, row = settled_load(run, at)
            run_hex = run.id.hex
            events += [
                {"id": run_hex, "version": v, "topic": t, "state": s, "at": to_us(when)}
                for v, t, s, when in log
            ]
            rows.append(self._row_params(row))
            if request is not None:
                requests.append({"run_id": run_hex, "kind": REQUEST, "body": request})
        with self._write() as (cur, _):
            cur.executemany(self.q["insert_events"], events)
            cur.executemany(self.q["insert_row"], rows)
            cur.executemany(self.q["put_saved"], requests)
        for run, _, _ in runs:
            run.mark_committed()
        return len(runs)

    def append(
        self,
        run: Run,
        *,
        resumable: bytes | None = None,
        then_claim: ClaimRequest | None = None,
        unless_signal: SignalGuard | None = None,
    ) -> list[ClaimedRun]:
        if not run.pending_events:
            return []
        if unless_signal is not None:
            self.append_guarded(run, unless_signal, resumable)
            return []
        # Everything is encoded before the write lock is taken; inside it only SQL runs, and
        # the statements that run with every step bind by position (ADR 0039).
        prepared = self._prepare_append(run, resumable)
        parent: Run | None = None
        with self._write() as (cur, at):
            self._write_append(cur, at, prepared)
            if settles_child(run):  # its parent's signal in the same write (ADR 0075)
                parent = self.tell_parent(cur, at, run)
            # A settle that claims the worker's next run in the same transaction (ADR 0058):
            # one write-lock turn instead of two. The settled run is claimable only if it
            # was requeued without a delay (available_at = at), as by any other claim.
            rows = self._claim_rows(cur, at, then_claim) if then_claim is not None else []
        run.mark_committed()
        if parent is not None:
            parent.mark_committed()
        if prepared.wake:
            self._woken.set()
        return self._claimed(rows, then_claim, at) if then_claim is not None and rows else []

    def append_in(self, cur: sqlite3.Cursor, at: int, run: Run, resumable: bytes | None) -> None:
        """`append`'s writes inside a write transaction the caller holds (a signal's delivery
        that wakes its run, a guarded suspension; ADR 0073). The caller marks `run`
        committed once its transaction committed."""
        prepared = self._prepare_append(run, resumable)
        self._write_append(cur, at, prepared)
        if prepared.wake:
            self._woken.set()  # early by a commit at most: a woken worker claims again later

    def _prepare_append(self, run: Run, resumable: bytes | None) -> _PreparedAppend:
        state = run.state
        run_hex = run.id.hex
        first = run.committed_version + 1
        pending = run.pending_events
        drop, wake = side_effects(state)
        lean = state.status is RunStatus.RUNNING and document_only(pending)
        doc = document_json(state)
        params: dict[str, Any] | None = None
        if not lean:
            params = column_values(state)
            params.update(run_id=run_hex, doc=doc, retry_delay_ms=claimable_after_ms(state))
        # A step's journal entry rides in its own StepRecorded's row (ADR 0050): an event
        # that lands brings its entry, one that does not, does not.
        cells = journal_cells(run)
        events = [
            (
                run_hex,
                first + i,
                *encode_event(e),
                cells.pop(e.seq, None) if cells and type(e) is Run.StepRecorded else None,
            )
            for i, e in enumerate(pending)
        ]
        if cells:
            raise RuntimeError(f"journal entries without their step's event: {sorted(cells)}")
        # Only a step already in the log can have left an entry: a run that settles with
        # its first steps (a one-step run, most of all) has none to drop.
        return _PreparedAppend(run, run_hex, state, doc, params, events, resumable, drop, wake)

    def _write_append(self, cur: sqlite3.Cursor, at: int, p: _PreparedAppend) -> None:
        if len(p.events) == 1:
            cur.execute(self.q["append_event"], (*p.events[0], at))
        else:
            cur.executemany(self.q["append_event"], [(*e, at) for e in p.events])
        if p.params is None:
            cur.execute(
                self.q["update_run_document"],
                (p.state.version, p.doc, at, p.state.lease_ms, at, p.run_hex),
            )
        else:
            p.params["at"] = at
            cur.execute(self.q["update_run"], p.params)
        if p.resumable is not None:
            cur.execute(
                self.q["put_saved"],
                {"run_id": p.run_hex, "kind": RESUMABLE, "body": p.resumable},
            )
        if p.drop:
            self._drop_on_settle(cur, p.run)
        cut = journal_cut(p.run)
        if cut is not None:
            cur.execute(self.q["drop_journal_from"], {"run_id": p.run_hex, "position": cut})

    def _drop_on_settle(self, cur: sqlite3.Cursor, run: Run) -> None:
        """Inside the settling append's transaction, after its inserts: drop the saved state
        and the journal, but a failed run's request, and its journal if it has a request
        to be retried with (`keeps_request`; ADRs 0025, 0070)."""
        state, run_hex = run.state, run.id.hex
        keep = keeps_request(state)
        cur.execute(self.q["drop_saved_but_request" if keep else "drop_saved"], {"run_id": run_hex})
        if keep:
            if state.steps:  # this append's own entries included: it runs after the inserts
                cur.execute(self.q["drop_journal_without_request"], {"run_id": run_hex})
        # Only a step already in the log can have left an entry: a run that settles with its
        # first steps (a one-step run, most of all) has none to drop.
        elif state.steps > sum(type(e) is Run.StepRecorded for e in run.pending_events):
            cur.execute(self.q["drop_journal"], {"run_id": run_hex})

    def claim_batch(
        self,
        *,
        holder: str,
        lease_ms: int,
        agents: Sequence[str],
        limit: int,
        queues: Sequence[str] | None = None,
    ) -> list[ClaimedRun]:
        request = ClaimRequest(
            holder=holder,
            lease_ms=lease_ms,
            agents=tuple(agents),
            limit=limit,
            queues=None if queues is None else tuple(queues),
        )
        with self._write() as (cur, at):
            rows = self._claim_rows(cur, at, request)
        return self._claimed(rows, request, at)

    def _claim_rows(self, cur: sqlite3.Cursor, at: int, request: ClaimRequest) -> list[sqlite3.Row]:
        """Inside a write transaction: lock nothing more (the database's write lock is held),
        pick up to `request.limit` runs (queues and priorities: `sqlite_queues`) and write
        their Claimed events and rows."""
        rows = pick_claimable(cur, self.q, request, at)
        if rows:
            topic, state = claimed_event(request.holder, request.lease_ms)
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
                    {
                        "run_id": r["run_id"],
                        "holder": request.holder,
                        "lease_ms": request.lease_ms,
                        "at": at,
                    }
                    for r in rows
                ],
            )
        return rows

    # -- reads ---------------------------------------------------------------------------------

    def _run(self, row: sqlite3.Row) -> Run:
        """The run `row` describes, or its log if the row cannot be decoded (ADR 0066)."""
        return readable_run(UUID(row["run_id"]), lambda: run_from_row(row), self._events)

    def _events(self, run_id: UUID) -> list[RunEvent]:
        return [recorded.event for recorded in self.history(run_id)]

    def _index_row(self, row: sqlite3.Row) -> RunRow:
        return _index_row(row, self._run(row))

    def _claimed(
        self, rows: Sequence[sqlite3.Row], request: ClaimRequest, at: int
    ) -> list[ClaimedRun]:
        """The runs `_claim_rows` claimed at `at`, as the worker takes them: the same Claimed fold
        the SQL applied, done outside the write lock. A row that cannot be decoded is read
        from the log, which holds the Claimed event already; a run unreadable both ways is
        left out and logged (its lease runs out and the reaper finds it, ADR 0066)."""

        def claimed(row: sqlite3.Row) -> ClaimedRun:
            def from_row() -> Run:
                run = run_from_row(row)
                run.claim(holder=request.holder, lease_ms=request.lease_ms)
                run.mark_committed()
                return run

            run = readable_run(UUID(row["run_id"]), from_row, self._events)
            age_s = max(0, at - row["created_at"]) / 1_000_000
            return ClaimedRun(run=run, request=bytes(row["request"] or b""), age_s=age_s)

        return skip_unreadable(claimed, rows)

    def _one(self, name: str, params: dict[str, Any]) -> sqlite3.Row | None:
        with self._read() as cur:
            cur.execute(self.q[name], params)
            row: sqlite3.Row | None = cur.fetchone()
            return row

    def load(self, run_id: UUID) -> Run | None:
        row = self._one("select_run", {"run_id": run_id.hex})
        return self._run(row) if row is not None else None

    def row(self, run_id: UUID) -> RunRow | None:
        row = self._one("select_run", {"run_id": run_id.hex})
        return self._index_row(row) if row is not None else None

    def saved(self, run_id: UUID, kind: str) -> bytes | None:
        row = self._one("select_saved", {"run_id": run_id.hex, "kind": kind})
        return bytes(row["body"]) if row is not None else None

    def request(self, run_id: UUID) -> bytes | None:
        return self.saved(run_id, REQUEST)

    def journal(self, run_id: UUID) -> list[JournalEntry]:
        with self._read() as cur:
            cur.execute(self.q["select_journal"], {"run_id": run_id.hex})
            return journal_from_cells(r[0] for r in cur.fetchall())

    def stale(self, limit: int) -> list[Run]:
        """Running runs whose lease ran out before this pass asked for the write lock, read
        inside it so that a renewal that got the lock first is seen (ADR 0016). Judged at
        the request, not at the grant (ADR 0049): a renewal that waited behind this pass was
        sent while its lease still ran, and is not judged by a clock that moved on meanwhile."""
        past = self._looked_past.remembered()
        asked = self.now_us()
        with self._write() as (cur, _):
            cur.execute(self.q["select_stale"], {"now": asked, "limit": limit + len(past)})
            rows = cur.fetchall()
        # Decoded once the write lock is released: a row read from the log instead (ADR
        # 0066) holds no writer back.
        return self._looked_past.scan(rows, lambda r: UUID(r["run_id"]), self._run, past, limit)

    def history(
        self, run_id: UUID, *, first: int = 1, limit: int | None = None
    ) -> list[RecordedEvent]:
        with self._read() as cur:
            if first <= 1 and limit is None:
                cur.execute(self.q["select_history"], {"run_id": run_id.hex})
            else:
                params = {
                    "run_id": run_id.hex,
                    "first": first,
                    "limit": -1 if limit is None else limit,
                }
                cur.execute(self.q["select_history_page"], params)
            rows = cur.fetchall()
        return [
            RecordedEvent(
                run_id=run_id,
                version=r["version"],
                recorded_at=to_datetime(r["recorded_at"]) or datetime.now(UTC),
                event=decode_event(
                    r["topic"], bytes(r["state"]), where=f"event {r['version']} of run {run_id}"
                ),
                notification_id=r["notification_id"],
            )
            for r in rows
        ]

    def list_rows(
        self,
        *,
        status: str | None,
        agent: str | None,
        reason: str | None,
        limit: int,
        before: tuple[datetime, UUID] | None = None,
    ) -> list[RunRow]:
        """Runs newest first, below the (created_at, run_id) key `before` (ADR 0042)."""
        params = {
            "status": status,
            "agent": agent,
            "reason": reason,
            "limit": limit,
            # Above every key: the largest instant, and 'g' sorts after any hex id.
            "before_at": to_us(before[0]) if before else 2**62,
            "before_id": before[1].hex if before else "g",
        }
        name = listing_query(status, agent)
        with self._read() as cur:
            cur.execute(self.q[name], params)
            rows = cur.fetchall()
        return [self._index_row(r) for r in rows]

    def failed_ids(
        self, *, agent: str | None, reason: str | None, since: datetime, limit: int
    ) -> list[UUID]:
        """Failed runs that last changed at or after `since`, oldest first."""
        params = {"agent": agent, "reason": reason, "since": to_us(since), "limit": limit}
        with self._read() as cur:
            cur.execute(self.q["select_failed_runs"], params)
            return [UUID(r["run_id"]) for r in cur.fetchall()]

    def all_rows(self) -> list[RunRow]:
        with self._read() as cur:
            cur.execute(self.q["select_all_runs"])
            rows = cur.fetchall()
        return [self._index_row(r) for r in rows]

    def index_ranges(self, batch: int = RANGE_RUNS) -> Iterator[IndexRange]:
        """The live run index and the index rebuilt from the log, one keyset range of run
        ids at a time (ADR 0040): at most `batch` runs of each per range, both read in one
        read transaction (one WAL snapshot), so writers in between cannot look like drift.
        A run's row and its whole log are always in the same range. A live row that cannot be
        decoded is reported as such, not read from the log (ADR 0066)."""
        lo: UUID | None = FIRST_ID
        while lo is not None:
            with self._read() as cur:
                cur.execute("BEGIN")
                try:
                    hi = self._range_end(cur, lo, batch)
                    bounds = {"lo": lo.hex, "hi": hi.hex}
                    cur.execute(self.q["range_runs"], bounds)
                    rows = cur.fetchall()
                    rebuilt = list(rebuild_rows(self._log(cur, bounds)))
                finally:
                    cur.execute("COMMIT")
            live, unreadable = split_unreadable(_index_row, rows, lambda r: UUID(r["run_id"]))
            yield IndexRange(live, rebuilt, unreadable)
            lo = after(hi)

    def _range_end(self, cur: sqlite3.Cursor, lo: UUID, batch: int) -> UUID:
        ends = []
        for name in ("range_end_runs", "range_end_log"):
            row = cur.execute(self.q[name], {"lo": lo.hex, "skip": batch - 1}).fetchone()
            ends.append(UUID(row["run_id"]) if row is not None else None)
        return range_end(ends)

    def _log(
        self, cur: sqlite3.Cursor, bounds: dict[str, str]
    ) -> Iterator[tuple[UUID, RunEvent, datetime]]:
        cur.execute(self.q["range_log"], bounds)
        while batch := cur.fetchmany(2000):
            for r in batch:
                at = to_datetime(r["recorded_at"])
                assert at is not None
                run_id = UUID(r["run_id"])
                where = f"event {r['version']} of run {run_id}"
                yield run_id, decode_event(r["topic"], bytes(r["state"]), where=where), at

    def rebuild_index(
        self, progress: Callable[[int], None] | None = None, *, batch: int = REBUILD_RANGE
    ) -> int:
        """Replace the run index with one folded from the log, one keyset range of run ids
        per write transaction (ADR 0040): the range's log is read and its rows replaced
        under the write lock, so no writer can change the range in between, and writers
        wait for one range at most, never for the whole rebuild. Returns the number of
        runs."""
        count = 0
        lo: UUID | None = FIRST_ID
        while lo is not None:
            with self._write() as (cur, _):
                hi = self._range_end(cur, lo, batch)
                bounds = {"lo": lo.hex, "hi": hi.hex}
                rows = [self._row_params(r) for r in rebuild_rows(self._log(cur, bounds))]
                cur.execute(self.q["delete_range_rows"], bounds)
                if rows:
                    cur.executemany(self.q["insert_row"], rows)
            count += len(rows)
            if progress is not None:
                progress(count)
            lo = after(hi)
        return count

    @staticmethod
    def _row_params(row: RunRow) -> dict[str, Any]:
        params = state_params(row.state)
        params["run_id"] = row.state.run_id.hex
        params["parent_id"] = _hex(row.state.parent_id)
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
        now = self.now_us()
        with self._read() as cur:
            return sum(
                int(cur.execute(
                    self.q["count_purgeable"], {"status": s, "cutoff": to_us(cutoff), "now": now}
                ).fetchone()["n"])
                for s in dict.fromkeys(statuses)
            )  # fmt: skip

    def live_purgeable(self, *, statuses: Sequence[str], cutoff: datetime) -> list[UUID]:
        if RunStatus.RUNNING.value not in statuses:
            return []  # only a running run can be held under a lease
        with self._read() as cur:
            cur.execute(
                self.q["select_live_purgeable"], {"cutoff": to_us(cutoff), "now": self.now_us()}
            )
            return [UUID(r["run_id"]) for r in cur.fetchall()]

    def purge_batch(
        self,
        *,
        category: str,
        statuses: Sequence[str],
        cutoff: datetime,
        limit: int,
        projections: Sequence[PurgeHook] = (),
    ) -> list[UUID]:
        """Remove up to `limit` runs due for purging, everywhere, in one transaction —
        including what each user projection keeps of them (its `forget`); deleted content is
        overwritten (secure_delete) so it does not linger in the file."""
        with self._write() as (cur, at):
            ids: list[UUID] = []
            for status in dict.fromkeys(statuses):  # one index walk per status (ADR 0041)
                if len(ids) >= limit:
                    break
                cur.execute(
                    self.q["select_purgeable"],
                    {
                        "status": status,
                        "cutoff": to_us(cutoff),
                        "limit": limit - len(ids),
                        "now": at,
                    },
                )
                ids += [UUID(r["run_id"]) for r in cur.fetchall()]
            if ids:
                params = {"ids": json.dumps([i.hex for i in ids]), "category": category, "now": at}
                for statement in statements(self.q["purge_runs"]):
                    cur.execute(statement, params)
                for _, forget in projections:
                    forget(ids, SqliteSql(cur))
        return ids

    def after_purge(self) -> None:
        """Fold the WAL back into the database so deleted content leaves the WAL file too."""
        with (
            self._writer_mutex,
            self.datastore.get_connection(commit=True) as conn,
            conn.cursor() as cur,
        ):
            cur.execute(self.q["after_purge"])

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

    @contextmanager
    def reporting_snapshot(self) -> Iterator[_SqliteTx]:
        """A read transaction: one WAL snapshot for all its statements."""
        with self._read() as cur:
            cur.execute("BEGIN")
            try:
                yield _SqliteTx(cur, self.q)
            finally:
                cur.execute("COMMIT")

    @contextmanager
    def scratch(self) -> Iterator[Callable[[], AbstractContextManager[_SqliteTx]]]:
        """A private in-memory database to rebuild a projection into (`verify`); yields a
        function that opens a transaction on it. Nothing of it outlives the block."""
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row

        @contextmanager
        def transaction() -> Iterator[_SqliteTx]:
            cur = conn.cursor()
            cur.execute("BEGIN")
            try:
                yield _SqliteTx(cur, self.q)
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

        try:
            yield transaction
        finally:
            conn.close()

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

    def wait_for_work(self, timeout: float) -> bool:
        woken = self._woken.wait(timeout)
        self._woken.clear()
        return woken

    def wake(self) -> None:
        self._woken.set()

    def held_back(self, *, agents: Sequence[str], queues: Sequence[str] | None = None) -> bool:
        """Whether a run of `agents` and `queues` with a concurrency key is due but waits
        for a place under its key's limit (ADR 0078; burst mode waits for it)."""
        with self._read() as cur:
            names = tuple(dict.fromkeys(agents))
            return held_back(
                cur, self.q, names, None if queues is None else tuple(queues), self.now_us()
            )


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

    def sql(self) -> SqliteSql:
        """The handle a user projection writes through, on this transaction."""
        return SqliteSql(self.cur)

    def rows_of(self, table: str) -> list[tuple[Any, ...]]:
        return sqlite_rows_of(self.cur, table)

    def drop(self, table: str) -> None:
        sqlite_drop(self.cur, table)


def _index_row(row: sqlite3.Row, run: Run | None = None) -> RunRow:
    """The row as the run index describes it; the run's state is `run`'s if given (read from
    the log when the row could not be), else decoded from the row."""
    return RunRow(
        state=(run if run is not None else run_from_row(row)).state,
        created_at=to_datetime(row["created_at"]) or datetime.now(UTC),
        updated_at=to_datetime(row["updated_at"]) or datetime.now(UTC),
        lease_expires_at=to_datetime(row["lease_expires_at"]),
        available_at=to_datetime(row["available_at"]),
    )
