"""The PostgreSQL store's plumbing: connection arguments from a URL, the pool or the one kept
connection of a one-shot command (ADR 0056), the mapping of database errors onto the two
domain errors, LISTEN/NOTIFY wake-ups, and `PostgresStoreBase`, the attributes every part of
`PostgresRunStore` (infrastructure/postgres.py) shares."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg.rows import DictRow, dict_row

from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.domain.ports import ClaimRequest
from steptrail.infrastructure.pg_children import PostgresChildren
from steptrail.infrastructure.pg_signals import PostgresSignals
from steptrail.infrastructure.pg_wake import PostgresWake
from steptrail.infrastructure.rate_limits_store import PostgresRateLimits
from steptrail.infrastructure.run_ids import PostgresRunIds
from steptrail.infrastructure.schedules_store import PostgresSchedules
from steptrail.infrastructure.store_base import (
    Claims,
    LookedPast,
    WakesIdleWorkers,
    claimed_event,
)

if TYPE_CHECKING:  # imported when a pool is made: a one-shot command keeps one connection
    from psycopg_pool import ConnectionPool

EVENTS_TABLE = "steptrail_events"
# The journal's columns as the append queries name their parameters (j_<column>[s]).
JOURNAL_COLUMNS = ("seq", "position", "kind", "name", "fingerprint", "outcome")
# Not a migration file: the step `migrate` takes on a database restored from another server.
RESTORED = "renumber_restored_log_positions"
_NO_ENTRY = dict.fromkeys(JOURNAL_COLUMNS)  # an append without a journal entry: NULLs
FENCE_SQLSTATE = "ST409"  # steptrail_append: the run is not at the expected version
_IDLE = psycopg.pq.TransactionStatus.IDLE
# psycopg_pool's PoolTimeout and PoolClosed are OperationalErrors.
_CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)
# Ours is the `eventsourcing` library's setting, kept when its datastore was dropped (ADR
# 0056): `idle_in_transaction_session_timeout` off, whatever the server or role sets.
_SESSION = "SET idle_in_transaction_session_timeout = '0ms'"
# The append queries whose settle may also claim (ADR 0058), and the claim's arguments that
# steptrail_append_claim takes after the append's.
APPENDS = ("append", "append_one", "append_two")
_CLAIM_ARGS = (
    ", %(c_agents)s::text[], %(c_limit)s::integer, %(c_topic)s::text, %(c_state)s::bytea,"
    " %(c_holder)s::text, %(c_lease_ms)s::bigint, %(c_queues)s::text[]"
)


def with_claim(query: str) -> str:
    """The append `query` (a call of steptrail_append) as a call of steptrail_append_claim
    with the same arguments and the claim's after them, returning the claimed rows as the
    `claim` query does (ADR 0058). Derived, not written out three more times: the append's
    arguments stay defined in one place."""
    head, found, call = query.partition("SELECT steptrail_append(")
    arguments = call.rstrip().removesuffix(";").rstrip()
    if not found or not arguments.endswith(")"):
        raise ValueError("not a call of steptrail_append")
    return (
        f"{head}SELECT (c.run).*, c.request FROM steptrail_append_claim("
        f"{arguments.removesuffix(')')}{_CLAIM_ARGS}) AS c ORDER BY (c.run).run_id"
    )


def connect_kwargs(url: str) -> dict[str, Any]:
    """psycopg's connection arguments for a `postgresql://` URL (its query string is not
    read; a missing host is 127.0.0.1, a missing user postgres)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {url!r}")
    dbname = unquote(parts.path.lstrip("/"))
    if not dbname:
        raise ValueError(f"the PostgreSQL URL names no database: {url!r}")
    return {
        "dbname": dbname,
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 5432,
        "user": unquote(parts.username or "postgres"),
        "password": unquote(parts.password or ""),
        "row_factory": dict_row,
    }


def _configure(conn: psycopg.Connection[DictRow]) -> None:
    """What every connection of the store is set to: autocommit (each hot-path write is one
    statement; a transaction is opened explicitly where one is wanted), the session setting."""
    conn.autocommit = True
    conn.execute(_SESSION)


def _connect(kwargs: Mapping[str, Any]) -> psycopg.Connection[DictRow]:
    conn: psycopg.Connection[DictRow] = psycopg.Connection.connect(connect_timeout=5, **kwargs)
    try:
        _configure(conn)
    except BaseException:
        conn.close()
        raise
    return conn


# Where a connection keeps its cursors of the hot-path statements (see `execute_kept`).
_KEPT_CURSORS = "_steptrail_kept_cursors"


def execute_kept(
    conn: psycopg.Connection[DictRow], query: str, params: Mapping[str, Any]
) -> psycopg.Cursor[DictRow]:
    """`query` run (prepared) on the cursor `conn` keeps for it, made at its first use, as
    `conn.execute` would run it on a new one (ADR 0091). psycopg keeps
    a cursor's adaptation context (its Transformer: the dumpers of the parameters, the
    loaders of the result's columns) while the cursor runs the same query object again,
    where `conn.execute` makes a cursor and a context per statement: 22 % less client CPU
    per append, 29 % per claim. Only for statements whose rows are fetched at once (the
    claim, the append): a kept cursor's next execute replaces its rows. Kept on the
    connection itself, so a connection the pool drops takes its cursors with it; a
    connection serves one thread at a time, and so do they."""
    kept: dict[str, psycopg.Cursor[DictRow]] | None = conn.__dict__.get(_KEPT_CURSORS)
    if kept is None:
        kept = conn.__dict__[_KEPT_CURSORS] = {}
    cursor = kept.get(query)
    if cursor is None or cursor.closed:
        cursor = kept[query] = conn.cursor()
    return cursor.execute(query, params, prepare=True)


class _Connections(Protocol):
    """Where the store's connections come from: a pool, or one kept connection."""

    def connection(self) -> AbstractContextManager[psycopg.Connection[DictRow]]: ...

    def close(self) -> None: ...


def make_pool(kwargs: Mapping[str, Any], pool_size: int) -> ConnectionPool[Any]:
    """A psycopg pool of `pool_size` connections (up to twice as many under load), opened,
    with every connection made there (StoreUnavailable-mapped errors if not within 10 s)."""
    from psycopg_pool import ConnectionPool

    pool: ConnectionPool[Any] = ConnectionPool(
        kwargs=dict(kwargs),
        connection_class=psycopg.Connection[DictRow],
        min_size=pool_size,
        max_size=pool_size * 2,
        open=False,
        configure=_configure,
        timeout=5.0,
        max_waiting=0,
        max_lifetime=60 * 60.0,
        # No check per checkout: it would double every round trip; a broken connection
        # fails the next statement instead, and the segment handles that (ADR 0007).
        check=None,
    )
    try:
        pool.open(wait=True, timeout=10.0)
    except BaseException:
        pool.close()
        raise
    return pool


# How long a thread keeps the connection it pinned before handing it back to the pool at
# its next use (and taking another): the pool's own lifetime and drain then apply to it.
PIN_LIFETIME_S = 10 * 60.0


class _Pin:
    """The connection one thread keeps (None until its first use, or after one went back),
    and the lock its use holds: a use nested in another, or `close` meanwhile, takes a
    connection of the pool instead."""

    __slots__ = ("conn", "until", "using")

    def __init__(self) -> None:
        self.conn: psycopg.Connection[DictRow] | None = None
        self.until = 0.0
        self.using = threading.Lock()


class PinnedPool:
    """The pool, where a thread that asked to (`pin`: a worker's dispatcher and its slot
    threads) keeps the connection it took instead of checking one out and back for every
    statement (ADR 0088). At most `most` threads keep one, so the pool's other users (the
    lease keeper, async runs' store threads, the reaper) still find `max_size - most`.

    A kept connection is used as a checked-out one is: each use is the pool's `connection()`
    context (commit on success, rollback on error: both nothing on an idle autocommit
    connection). It goes back to the pool, which drops a broken one and makes a new one, or
    rolls back one left in a transaction, whenever a use leaves it anything but idle (a lost
    connection fails that statement with StoreUnavailable, and the next use takes another
    connection: reconnecting as the pool does), after `PIN_LIFETIME_S`, when its thread
    unpins, and when the store closes.
    """

    def __init__(self, pool: ConnectionPool[Any], most: int) -> None:
        self.pool = pool
        self._most = most
        self._opened_with = most
        self._local = threading.local()
        self._pins: dict[threading.Thread, _Pin] = {}
        self._lock = threading.Lock()
        self._closed = False

    def pin(self) -> bool:
        """Let the calling thread keep a connection from its next use on, until it calls
        `unpin`; False (nothing kept) if `most` threads already do. A pin of a thread that
        ended without unpinning goes back to the pool here and in `unpin`."""
        with self._lock:
            self._sweep()
            if getattr(self._local, "pin", None) is not None:
                return True
            if self._closed or len(self._pins) >= self._most:
                return False
            pin = self._local.pin = _Pin()
            self._pins[threading.current_thread()] = pin
            return True

    def reserve(self, threads: int) -> None:
        """Let `threads` threads keep a connection (a worker's dispatcher and slot threads,
        ADR 0090), where fewer could: the places grow to `threads`, up to twice what the
        store was opened with, and the pool's bounds by as many, so that its other users
        (the lease keeper above all) still find as many connections as before. Never
        shrinks: a second worker of the same store that asks for fewer changes nothing. A
        worker of more slots than that (async ones run thousands) pins what it can and its
        other threads check out per statement, as before."""
        with self._lock:
            places = min(threads, 2 * self._opened_with)
            extra = places - self._most
            if extra <= 0 or self._closed:
                return
            self._most = places
            pool = self.pool
            pool.resize(pool.min_size + extra, pool.max_size + extra)

    def unpin(self) -> None:
        """The calling thread's connection back to the pool; it checks out from now on."""
        with self._lock:
            pin = getattr(self._local, "pin", None)
            self._local.pin = None
            if pin is not None:
                self._pins.pop(threading.current_thread(), None)
                self._give_back(pin)
            self._sweep()

    def _sweep(self) -> None:
        for thread in [t for t in self._pins if not t.is_alive()]:
            self._give_back(self._pins.pop(thread))

    def _give_back(self, pin: _Pin) -> None:
        """`pin`'s connection back to the pool, unless a use holds it (that use gives it
        back when it ends: it finds the pin dropped or the store closed)."""
        if pin.using.acquire(blocking=False):
            try:
                conn, pin.conn = pin.conn, None
                if conn is not None:
                    self.pool.putconn(conn)
            finally:
                pin.using.release()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[DictRow]]:
        pin: _Pin | None = getattr(self._local, "pin", None)
        if pin is None or self._closed or not pin.using.acquire(blocking=False):
            with self.pool.connection() as conn:
                yield conn
            return
        try:
            conn = pin.conn
            if conn is None:
                conn = pin.conn = self.pool.getconn()
                pin.until = time.monotonic() + PIN_LIFETIME_S
            failed = True
            try:
                yield conn
                failed = False
            finally:
                if conn.info.transaction_status != _IDLE:
                    # As the pool's connection() would on its way out: commit or roll back
                    # (or nothing, on a closed connection); then back to the pool.
                    pin.conn = None
                    try:
                        if conn.closed:
                            pass
                        elif not failed:
                            conn.commit()
                        else:
                            with suppress(psycopg.Error):  # the error on its way out wins
                                conn.rollback()
                    finally:
                        self.pool.putconn(conn)
                elif self._closed or time.monotonic() >= pin.until:
                    pin.conn = None
                    self.pool.putconn(conn)
        finally:
            pin.using.release()
        if self._closed or getattr(self._local, "pin", None) is not pin:
            self._give_back(pin)  # closed or unpinned meanwhile: see `_give_back`

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for pin in self._pins.values():
                self._give_back(pin)
            self._pins.clear()
        self.pool.close()


class OneConnection:
    """One kept connection for a one-shot command, and another opened only while it is
    taken (a use nested in another, or one from a second thread) and closed after that use.

    What the pool did on a connection's return is done here too: a broken connection is
    dropped (the next use connects again), one left in a transaction is rolled back.
    """

    def __init__(self, kwargs: Mapping[str, Any], first: psycopg.Connection[DictRow]) -> None:
        self._kwargs = dict(kwargs)
        self._kept: psycopg.Connection[DictRow] | None = first
        self._taken = threading.Lock()
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[DictRow]]:
        if self._closed:
            raise psycopg.OperationalError("the store is closed")
        if not self._taken.acquire(blocking=False):
            with _connect(self._kwargs) as extra:
                yield extra
            return
        try:
            if self._kept is None or self._kept.closed:
                self._kept = _connect(self._kwargs)
            conn = self._kept
            try:
                yield conn
            finally:
                self._settle(conn)
        finally:
            self._taken.release()

    def _settle(self, conn: psycopg.Connection[DictRow]) -> None:
        if self._closed or conn.broken or conn.closed:
            self._kept = None
            conn.close()
        elif conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.rollback()
            except psycopg.Error:
                self._kept = None
                conn.close()

    def close(self) -> None:
        """Close the kept connection now, or (in use by another thread) when it is returned,
        as the pool does."""
        self._closed = True
        if self._taken.acquire(blocking=False):
            try:
                if self._kept is not None:
                    self._kept.close()
                    self._kept = None
            finally:
                self._taken.release()


class PostgresStoreBase(
    PostgresRunIds,
    PostgresSchedules,
    PostgresRateLimits,
    PostgresSignals,
    PostgresChildren,
    PostgresWake,
    Claims,
    WakesIdleWorkers,
):
    """What every part of `PostgresRunStore` shares: its attributes (set by its `__init__`),
    a connection with the database's errors mapped onto the domain's, and the wake-up of idle
    workers. The parts (reads, writes, bulk, reporting) build on it; `PostgresRunStore`
    composes them."""

    backend = "postgres"
    url: str
    q: dict[str, str]
    _woken: threading.Event
    _listener: threading.Thread | None
    _closed: threading.Event
    _claim_prepared: weakref.WeakSet[psycopg.Connection[Any]]
    _purged_lock: threading.Lock
    _purged_rows: int
    _looked_past: LookedPast
    _connections: _Connections

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[DictRow]]:
        try:
            with self._connections.connection() as conn:
                yield conn
        except psycopg.errors.ForeignKeyViolation as e:
            if e.diag.constraint_name == "steptrail_events_run_fk":
                raise VersionConflict("the run no longer exists (purged)") from e
            raise
        except psycopg.errors.UniqueViolation as e:
            # Only the log's primary key is a fence; any other unique violation is a bug
            # (or a taken idempotency key, which insert_run handles without raising).
            if e.diag.constraint_name == f"{EVENTS_TABLE}_pkey":
                raise VersionConflict("somebody appended to the run first") from e
            raise
        except _CONNECTION_ERRORS as e:
            raise StoreUnavailable(_first_line(e)) from e
        except psycopg.DatabaseError as e:
            # Checked after the connection errors: those are DatabaseErrors too.
            if e.sqlstate == FENCE_SQLSTATE:  # steptrail_append's version check
                raise VersionConflict("somebody appended to the run first") from e
            raise

    # -- waking idle workers -------------------------------------------------------------------

    def wait_for_work(self, timeout: float) -> bool:
        if self._listener is None:
            self._listener = threading.Thread(
                target=self._listen, name="steptrail-listen", daemon=True
            )
            self._listener.start()
        return super().wait_for_work(timeout)

    def _listen(self) -> None:
        """LISTEN on a connection of its own; reconnect with a pause when it drops."""
        while not self._closed.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(self.q["listen_queued"])
                    # Anything queued while we were not listening must be looked at too.
                    self._woken.set()
                    while not self._closed.is_set():
                        for _ in conn.notifies(timeout=1.0):
                            self._woken.set()
            except psycopg.Error:
                self._closed.wait(1.0)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _claim_params(request: ClaimRequest, *, prefix: str) -> dict[str, Any]:
    """The `claim` query's parameters (`prefix`ed as steptrail_append_claim's are)."""
    topic, state = claimed_event(request.holder, request.lease_ms)
    return {
        f"{prefix}agents": list(dict.fromkeys(request.agents)),
        f"{prefix}queues": None if request.queues is None else list(dict.fromkeys(request.queues)),
        f"{prefix}topic": topic,
        f"{prefix}state": state,
        f"{prefix}holder": request.holder,
        f"{prefix}lease_ms": request.lease_ms,
        f"{prefix}limit": request.limit,
    }
