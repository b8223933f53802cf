"""The run store on PostgreSQL (psycopg 3 with a connection pool).

Every hot-path write is one statement in autocommit — an append is one call of the
`steptrail_append` function, a claim and an enqueue are one statement each — so each costs
one network round trip and one commit. Writers of one run queue on its index row; writers of
different runs never wait for each other (ADR 0012). Failures map to two domain errors only:
the fence (a run not at the expected version, or a taken log key) is a `VersionConflict`;
anything that lost the connection is `StoreUnavailable`.

Connections: a long-lived process (a worker, the console) gets a pool of `pool_size`
connections, opened at start. A one-shot command (the CLI's `stats`, `runs`, `enqueue`,
`reap`...) keeps the one connection it opened to check the server and opens another only
while that one is busy (a nested or concurrent use): four more connections, the pool's
threads and psycopg_pool's import cost such a command more than its work (ADR 0056).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import DictRow

from steptrail.domain.errors import StoreUnavailable
from steptrail.infrastructure.pg_bulk import PostgresBulk
from steptrail.infrastructure.pg_connections import (
    _CONNECTION_ERRORS,
    APPENDS,
    EVENTS_TABLE,
    FENCE_SQLSTATE,
    JOURNAL_COLUMNS,
    RESTORED,
    OneConnection,
    PinnedPool,
    _claim_params,
    _connect,
    _Connections,
    _first_line,
    connect_kwargs,
    make_pool,
    with_claim,
)
from steptrail.infrastructure.pg_reporting import PostgresReporting
from steptrail.infrastructure.sqlfiles import migrations, queries
from steptrail.infrastructure.store_base import (
    LookedPast,
)

__all__ = [
    "APPENDS",
    "EVENTS_TABLE",
    "FENCE_SQLSTATE",
    "JOURNAL_COLUMNS",
    "RESTORED",
    "OneConnection",
    "PinnedPool",
    "PostgresRunStore",
    "_claim_params",
    "connect_kwargs",
    "make_pool",
    "with_claim",
]


class PostgresRunStore(PostgresBulk, PostgresReporting):
    """`RunStore` on PostgreSQL. See the module docstring for the write protocol; its parts
    are `pg_connections` (plumbing), `pg_reads`, `pg_writes`, `pg_bulk` and `pg_reporting`."""

    def __init__(self, url: str, *, pool_size: int = 4, one_shot: bool = False) -> None:
        """Connect to the database at `url`: a pool of `pool_size` connections, or with
        `one_shot` (a command that ends once its work is done) one connection kept.

        Raises:
            ValueError: not a PostgreSQL URL, or one without a database.
            StoreUnavailable: the server cannot be reached.
        """
        self.url = url
        kwargs = connect_kwargs(url)
        named = queries(self.backend)  # cached and shared: extended in a copy
        self.q = {**named, **{f"{name}_claim": with_claim(named[name]) for name in APPENDS}}
        self._woken = threading.Event()
        self._listener: threading.Thread | None = None
        self._closed = threading.Event()
        self._claim_prepared: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
        # Rows purged since the last after_purge: what its VACUUM will find (ADR 0065).
        self._purged_lock = threading.Lock()
        self._purged_rows = 0
        # Runs unreadable both ways the reaper's scan looks past for a while (ADR 0066).
        self._looked_past = LookedPast()
        # The pool logs every failed connection attempt as a warning while it retries; what
        # fails is raised to the caller instead (the eventsourcing library's levels, kept).
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        logging.getLogger("psycopg").setLevel(logging.ERROR)
        self._connections: _Connections
        try:
            if one_shot:
                # The first connection fails fast, with the server's own words ("connection
                # refused", "database does not exist"), and is the one the command uses.
                self._connections = OneConnection(kwargs, _connect(kwargs))
            else:
                # One plain connection first, for the same words: the pool would only time
                # out.
                psycopg.connect(url, connect_timeout=5).close()
                self._connections = PinnedPool(make_pool(kwargs, pool_size), most=pool_size)
        except _CONNECTION_ERRORS as e:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {_first_line(e)}") from e

    # -- plumbing ------------------------------------------------------------------------------

    def pin_connection(self) -> bool:
        """Let the calling thread keep the pool's connection it takes next, for its later
        statements too, until `unpin_connection` (ADR 0088): a worker's dispatcher and slot
        threads do, to skip a checkout and return per statement. False if the store keeps
        one connection (one-shot) or `pool_size` threads already keep one."""
        connections = self._connections
        return isinstance(connections, PinnedPool) and connections.pin()

    def reserve_connections(self, threads: int) -> None:
        """Let `threads` threads keep a connection each (`pin_connection`), growing the
        pool by as many more than `pool_size` (ADR 0090): a worker of C slots asks for its
        dispatcher and its slots, C + 1. Nothing for a one-shot store."""
        connections = self._connections
        if isinstance(connections, PinnedPool):
            connections.reserve(threads)

    def unpin_connection(self) -> None:
        """Hand the calling thread's kept connection back to the pool (and those of threads
        that ended without doing so)."""
        connections = self._connections
        if isinstance(connections, PinnedPool):
            connections.unpin()

    def close(self) -> None:
        self._closed.set()
        self._connections.close()
        if self._listener is not None:
            self._listener.join(timeout=2)

    # -- schema --------------------------------------------------------------------------------

    def migrate(self, *, upto: int | None = None) -> list[str]:
        """Apply missing migrations under an advisory lock (only those numbered `upto` or
        lower, if given); returns the names applied."""
        applied_now: list[str] = []
        complete = True
        with self._connection() as conn, conn.transaction():
            conn.execute(self.q["migration_lock"])
            conn.execute(self.q["create_migrations_table"])
            done = {r["version"] for r in conn.execute(self.q["applied_migrations"])}
            for number, name, sql in migrations(self.backend):
                if number in done:
                    continue
                if upto is not None and number > upto:
                    complete = False
                    continue
                conn.execute(sql.encode("utf-8"))  # migration text ships with steptrail
                conn.execute(self.q["record_migration"], {"version": number, "name": name})
                applied_now.append(f"{number:04d}_{name}")
        if complete and self._renumber_restored():  # it reads tables of the whole schema
            applied_now.append(RESTORED)
        return applied_now

    def _restored(self, conn: psycopg.Connection[DictRow]) -> bool:
        row = conn.execute(self.q["restored_positions"]).fetchone()
        return bool(row and row["restored"])

    def _renumber_restored(self) -> bool:
        """Renumber the log's positions if the database was restored from another server
        (ADR 0046); True if it did. Under the migration lock, so once for a fleet."""
        with self._connection() as conn, conn.transaction():
            conn.execute(self.q["migration_lock"])
            if not self._restored(conn):
                return False
            conn.execute(self.q["restored_tx_map"])
            row = conn.execute(self.q["restored_tx_count"]).fetchone()
            assert row is not None  # an aggregate always returns its row
            top = int(row["top"])
            if int(row["next_tx"]) <= top:
                # More transactions in the restored log than this server has run: use ids up
                # first (outside this transaction: each must commit), then map again.
                self._advance_tx_ids(top)
            for name in (
                "renumber_tracking",
                "renumber_projection_failures",
                "renumber_purged_events",
                "renumber_events",
            ):
                conn.execute(self.q[name])
        return True

    def _advance_tx_ids(self, until: int) -> None:
        query = pgsql.SQL(self.q["advance_tx_ids"]).format(until=pgsql.Literal(until))
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            conn.execute(query)

    def pending_migrations(self) -> list[str]:
        with self._connection() as conn:
            exists = conn.execute(
                "SELECT to_regclass('steptrail_schema_migrations') IS NOT NULL AS e"
            ).fetchone()
            done: set[int] = set()
            if exists and exists["e"]:
                done = {r["version"] for r in conn.execute(self.q["applied_migrations"])}
            pending = [
                f"{n:04d}_{name}" for n, name, _ in migrations(self.backend) if n not in done
            ]
            if not pending and self._restored(conn):
                pending.append(RESTORED)
        return pending
