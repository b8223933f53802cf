"""The SQLite store's plumbing: where a `sqlite:` URL points, how a connection is opened and
configured, the cross-process handover of the write turn, the WAL checkpointer thread, the
clock and cell codecs, and `SQLiteStoreBase`, the attributes and reads every part of
`SQLiteRunStore` (infrastructure/sqlite.py) shares. The write turn itself (`_write`) lives
with the store in sqlite.py, beside the checkpoint threshold it counts commits against.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn
from urllib.parse import parse_qs, quote, urlsplit
from uuid import UUID, uuid4

from eventsourcing.persistence import InterfaceError, PersistenceError
from eventsourcing.sqlite import SQLiteConnection, SQLiteConnectionPool, SQLiteDatastore

from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.domain.journal import JournalEntry
from steptrail.domain.run import Run
from steptrail.infrastructure.children_store import SQLiteChildren
from steptrail.infrastructure.rate_limits_store import SQLiteRateLimits
from steptrail.infrastructure.run_ids import SQLiteRunIds
from steptrail.infrastructure.schedules_store import SQLiteSchedules
from steptrail.infrastructure.sqlite_signals import SQLiteSignals
from steptrail.infrastructure.sqlite_wake import SQLiteWake
from steptrail.infrastructure.store_base import (
    Claims,
    LookedPast,
    WakesIdleWorkers,
    pending_entries,
)

BUSY_TIMEOUT_SECONDS = 30
# How long a writer waits for another process's turn on the database before it gives up as
# on any store error (its segment retries, then fences itself). Short against a lease: a
# stopped process holding the turn must not freeze every writer with it (ADR 0016).
HANDOVER_TIMEOUT_SECONDS = 5.0
STATEMENT_CACHE = 64  # prepared statements kept per connection
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


class SQLiteStoreBase(
    SQLiteRunIds,
    SQLiteSchedules,
    SQLiteRateLimits,
    SQLiteSignals,
    SQLiteChildren,
    SQLiteWake,
    Claims,
    WakesIdleWorkers,
):
    """What every part of `SQLiteRunStore` shares: its attributes (set by its `__init__`), the
    store's clock, a read cursor and the wake-up of idle workers. The parts (reads, claims,
    writes, bulk, reporting) build on it; `SQLiteRunStore` composes them."""

    backend = "sqlite"
    url: str
    db_name: str
    path: Path | None
    read_only: bool
    datastore: SQLiteDatastore
    q: dict[str, str]
    clock_offset_us: int
    _lock_fd: int | None
    _lock_open: threading.Lock
    _handover: _Handover | None
    _writer: sqlite3.Cursor | None
    _writer_mutex: threading.Lock
    _handover_timeout: float
    _commits: int
    _checkpointer: _Checkpointer
    _looked_past: LookedPast
    _woken: threading.Event

    def now_us(self) -> int:
        """The store's clock: the host's, plus the testing kit's skipped time (if any)."""
        return now_us() + self.clock_offset_us

    def _write(self) -> AbstractContextManager[tuple[sqlite3.Cursor, int]]:
        """A cursor in an IMMEDIATE transaction and the store's clock read inside it: the
        write turn, `SQLiteRunStore._write` (infrastructure/sqlite.py)."""
        raise NotImplementedError

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Cursor]:
        try:
            with self.datastore.get_connection(commit=False) as conn, conn.cursor() as cur:
                yield cur
        except (sqlite3.OperationalError, PersistenceError) as e:
            raise StoreUnavailable(str(e)) from e

    def store_now(self) -> datetime:
        return to_datetime(self.now_us()) or datetime.now(UTC)
