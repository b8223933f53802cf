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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlsplit
from uuid import UUID, uuid4

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from steptrail.domain.children import settles_child
from steptrail.domain.enums import RunStatus
from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.domain.journal import JournalEntry
from steptrail.domain.ports import ClaimedRun, ClaimRequest, RecordedEvent
from steptrail.domain.queues import priority_changed
from steptrail.domain.run import Run, RunEvent
from steptrail.domain.waits import SignalGuard
from steptrail.infrastructure.codec import decode_event, encode_event
from steptrail.infrastructure.pg_children import PostgresChildren
from steptrail.infrastructure.pg_signals import PostgresSignals
from steptrail.infrastructure.pg_wake import PostgresWake
from steptrail.infrastructure.rate_limits_store import PostgresRateLimits
from steptrail.infrastructure.reporting_store import PROJECTION
from steptrail.infrastructure.run_ids import PostgresRunIds
from steptrail.infrastructure.schedules_store import PostgresSchedules
from steptrail.infrastructure.sqlfiles import migrations, queries, statements
from steptrail.infrastructure.store_base import (
    FIRST_ID,
    RANGE_RUNS,
    REBUILD_RANGE,
    REQUEST,
    ClaimsOne,
    LookedPast,
    after,
    claimed_event,
    encoded_events,
    journal_cut,
    journal_from_rows,
    journal_rows,
    keeps_request,
    listing_query,
    range_end,
    readable_run,
    run_from_row,
    settled_load,
    side_effects,
    skip_unreadable,
    split_unreadable,
    state_params,
)
from steptrail.infrastructure.user_sql import PostgresSql, postgres_drop, postgres_rows_of
from steptrail.projections.custom import PurgeHook
from steptrail.projections.run_index import (
    IndexRange,
    RunRow,
    claimable_after_ms,
    column_values,
    document_json,
    rebuild_rows,
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


class PostgresRunStore(
    PostgresRunIds,
    PostgresSchedules,
    PostgresRateLimits,
    PostgresSignals,
    PostgresChildren,
    PostgresWake,
    ClaimsOne,
):
    """`RunStore` on PostgreSQL. See the module docstring for the write protocol."""

    backend = "postgres"

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
                self._connections = make_pool(kwargs, pool_size)
        except _CONNECTION_ERRORS as e:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {_first_line(e)}") from e

    # -- plumbing ------------------------------------------------------------------------------

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

    # -- writes --------------------------------------------------------------------------------

    def _params(self, run: Run) -> dict[str, Any]:
        params = state_params(run.state)
        params["doc"] = Jsonb(params["doc"])
        return params

    def create(self, run: Run, *, request: bytes | None) -> Run:
        (version, topic, state), *rest = encoded_events(run)
        assert version == 1, "a run is created at version 1"
        assert not rest, "a run is created by exactly one event"
        params = {**self._params(run), "topic": topic, "state": state, "request": request}
        with self._connection() as conn:
            row = conn.execute(self.q["insert_run"], params, prepare=True).fetchone()
        if row is not None and row["created"]:
            run.mark_committed()
            self.wake_here(run)
            return run
        if row is None:
            # The key was taken by a transaction that committed after the insert began, so
            # the row was not in its snapshot: read it now (the only second round trip).
            row = self._one("select_run_by_key", {"idempotency_key": run.state.idempotency_key})
            assert row is not None, "insert_run skipped but no run has the key"
        return self._run(row)

    def create_many(self, runs: Sequence[tuple[Run, bytes | None]]) -> list[UUID]:
        """Record many new runs in one statement (one round trip); see `RunStore.create_many`."""
        if not runs:
            return []
        columns: dict[str, list[Any]] = {name: [] for name in _MANY_COLUMNS.values()}
        for run, request in runs:
            (version, topic, state), *rest = encoded_events(run)
            assert version == 1, "a run is created at version 1"
            assert not rest, "a run is created by exactly one event"
            params = self._params(run)
            params.update(topic=topic, state=state, request=request)
            for name, plural in _MANY_COLUMNS.items():
                columns[plural].append(params[name])
        with self._connection() as conn:
            rows = conn.execute(self.q["insert_runs"], columns).fetchall()
        created = {r["run_id"] for r in rows if r["created"]}
        by_key = {r["idempotency_key"]: r["run_id"] for r in rows if r["idempotency_key"]}
        for run, _ in runs:
            if run.id in created:
                run.mark_committed()
                self.wake_here(run)
        missing = [
            run.state.idempotency_key
            for run, _ in runs
            if run.id not in created and run.state.idempotency_key not in by_key
        ]
        if missing:
            # Keys taken by transactions that committed after the insert began.
            with self._connection() as conn:
                found = conn.execute(self.q["select_runs_by_keys"], {"keys": missing})
                by_key.update((r["idempotency_key"], r["run_id"]) for r in found)
        stored = []
        for run, _ in runs:
            key = run.state.idempotency_key
            stored.append(run.id if run.id in created else by_key[key])
        return stored

    def bulk_load_settled(self, runs: Sequence[tuple[Run, datetime, bytes | None]]) -> int:
        """Write whole settled runs in one transaction: for loading benchmark databases only
        (bench/scale.py; ADR 0044), never a live one. Each item is a new run whose pending
        events take it from creation to settlement, the instant of its first event, and the
        request it keeps (failed runs keep theirs, ADR 0025; None otherwise). Writes the log
        (events `LOAD_SPACING` apart), the index row as `rebuild` folds it, and the kept
        request; no fence, no idempotency check, no wake-up, and the reporting views are
        left to the projector. Returns the number of runs written."""
        loads = [(run, *settled_load(run, at), request) for run, at, request in runs]
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            with cur.copy(self.q["copy_events"]) as copy:
                for run, log, _, _ in loads:
                    for version, topic, state, when in log:
                        copy.write_row((run.id, version, topic, state, when))
            with cur.copy(self.q["copy_runs"]) as copy:
                for _, _, row, _ in loads:
                    p = self._row_params(row)
                    copy.write_row([p[c] for c in _ROW_COLUMNS])
            with cur.copy(self.q["copy_saved"]) as copy:
                for run, _, _, request in loads:
                    if request is not None:
                        copy.write_row((run.id, REQUEST, request))
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
        if settles_child(run):  # its parent's signal in the same transaction (ADR 0075)
            keep = run.state.status.is_terminal and keeps_request(run.state)
            self.settle_child(run, resumable=resumable, keep_request=keep)
            return []
        name, params = self.append_statement(run, resumable=resumable)
        rows: list[DictRow] = []
        cut = journal_cut(run)
        with self._connection() as conn:
            if cut is not None:
                # `retry --from N` (rare): the append, then the entries from N on, in one
                # transaction; the function's fence raises first if another retry won.
                with conn.transaction():
                    conn.execute(self.q[name], params, prepare=True)
                    conn.execute(self.q["drop_journal_from"], {"run_id": run.id, "position": cut})
            elif priority_changed(run):
                # An operator's PriorityChanged (rare): steptrail_append writes no queue or
                # priority (nothing else changes them), so the new priority goes into the
                # row in the append's transaction, after its fence (ADR 0077).
                with conn.transaction():
                    conn.execute(self.q[name], params, prepare=True)
                    conn.execute(
                        self.q["set_priority"], {"run_id": run.id, "priority": run.state.priority}
                    )
            elif not (run.state.status.is_terminal and keeps_request(run.state)):
                if then_claim is None:
                    conn.execute(self.q[name], params, prepare=True)
                else:
                    params.update(_claim_params(then_claim, prefix="c_"))
                    cur = conn.execute(self.q[f"{name}_claim"], params, prepare=True)
                    rows = cur.fetchall()
            else:
                # A failed settle (rare): the append with drop_saved off, then everything
                # saved but the request (and the journal, which it keeps too; ADR 0070),
                # in one transaction. Kept out of
                # steptrail_append so that its one-round-trip hot path stays as it is. It
                # claims nothing: the worker claims for the freed slot as usual.
                with conn.transaction():
                    conn.execute(self.q[name], params, prepare=True)
                    conn.execute(self.q["drop_saved_but_request"], {"run_id": run.id})
        run.mark_committed()
        self.wake_here(run)
        return self._claimed(rows) if rows else []

    def append_statement(
        self, run: Run, *, resumable: bytes | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The query and its parameters for `run`'s pending events and journal: with one
        event or two (a settle carrying the last step) and at most one journal entry, the
        scalar `append_one` or `append_two`; else `append`, whose arrays psycopg adapts at a
        cost per list (ADR 0039, ADR 0053)."""
        pending = run.pending_events
        journal = journal_rows(run)
        if len(pending) > 2 or len(journal) > 1:
            return "append", self.append_params(run, resumable=resumable)
        params = self._append_common(run, resumable)
        params["topic"], params["state"] = encode_event(pending[0])
        if len(pending) == 2:
            params["topic_2"], params["state_2"] = encode_event(pending[1])
        entry = journal[0] if journal else _NO_ENTRY
        for column in JOURNAL_COLUMNS:
            params[f"j_{column}"] = entry[column]
        return ("append_one" if len(pending) == 1 else "append_two"), params

    def append_params(self, run: Run, *, resumable: bytes | None = None) -> dict[str, Any]:
        """The parameters of the `append` query for `run`'s pending events and journal."""
        events = encoded_events(run)
        journal = journal_rows(run)
        params = self._append_common(run, resumable)
        params["versions"] = [v for v, _, _ in events]
        params["topics"] = [t for _, t, _ in events]
        params["states"] = [s for _, _, s in events]
        for column in JOURNAL_COLUMNS:
            params[f"j_{column}s"] = [j[column] for j in journal]
        return params

    @staticmethod
    def _append_common(run: Run, resumable: bytes | None) -> dict[str, Any]:
        """What `append` and `append_one` share: the run's columns, its document as JSON
        text (one pydantic-core call; psycopg's Jsonb would run json.dumps over a dict
        model_dump built), the fence and the side effects."""
        state = run.state
        drop, notify = side_effects(state)
        keep = drop and keeps_request(state)  # see `append`
        params = column_values(state)
        params["doc"] = document_json(state)
        params["retry_delay_ms"] = claimable_after_ms(state)
        params["expected"] = run.committed_version
        params["resumable"] = resumable
        params["drop_saved"] = drop and not keep
        params["notify"] = notify
        return params

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
        params = _claim_params(request, prefix="")
        with self._connection() as conn:
            if conn in self._claim_prepared:
                rows = conn.execute(self.q["claim"], params, prepare=True).fetchall()
            else:
                # Outside a pipeline psycopg prepares on first use with a round trip of its
                # own (Parse, wait, then Bind/Execute); in one, Parse goes with the rest: the
                # claim is one round trip on a fresh connection too (ADR 0038). Only then:
                # a pipeline costs the client more CPU than a plain execute.
                with conn.pipeline():
                    rows = conn.execute(self.q["claim"], params, prepare=True).fetchall()
                self._claim_prepared.add(conn)
        return self._claimed(rows)

    # -- reads ---------------------------------------------------------------------------------

    def load(self, run_id: UUID) -> Run | None:
        row = self._one("select_run", {"run_id": run_id})
        return self._run(row) if row is not None else None

    def row(self, run_id: UUID) -> RunRow | None:
        row = self._one("select_run", {"run_id": run_id})
        return self._index_row(row) if row is not None else None

    def saved(self, run_id: UUID, kind: str) -> bytes | None:
        row = self._one("select_saved", {"run_id": run_id, "kind": kind})
        return bytes(row["body"]) if row is not None else None

    def request(self, run_id: UUID) -> bytes | None:
        return self.saved(run_id, REQUEST)

    def journal(self, run_id: UUID) -> list[JournalEntry]:
        with self._connection() as conn:
            rows = conn.execute(self.q["select_journal"], {"run_id": run_id}, prepare=True)
            return journal_from_rows(rows.fetchall())

    def stale(self, limit: int) -> list[Run]:
        """Running runs whose lease expired, judged after every write already queued has
        landed (ADR 0016): a renewal that waited on a lock is not mistaken for a dead worker."""
        past = self._looked_past.remembered()
        with self._connection() as conn, conn.transaction():
            conn.execute(self.q["lock_for_reaper"])
            params = {"limit": limit + len(past)}
            rows = conn.execute(self.q["select_stale"], params, prepare=True).fetchall()
        # Decoded after the scan's transaction (and its SHARE lock) ended: a row that must be
        # read from the log instead (ADR 0066) holds no writer back.
        return self._looked_past.scan(rows, lambda r: r["run_id"], self._run, past, limit)

    def history(
        self, run_id: UUID, *, first: int = 1, limit: int | None = None
    ) -> list[RecordedEvent]:
        with self._connection() as conn:
            if first <= 1 and limit is None:
                rows = conn.execute(self.q["select_history"], {"run_id": run_id}).fetchall()
            else:
                params = {"run_id": run_id, "first": first, "limit": limit}
                rows = conn.execute(self.q["select_history_page"], params).fetchall()
        return [
            RecordedEvent(
                run_id=run_id,
                version=r["version"],
                recorded_at=r["recorded_at"],
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
            # Above every key: the last instant PostgreSQL keeps, and the largest uuid (a
            # run id never has it: its version nibble is 7, or 4 before ADR 0052).
            "before_at": before[0] if before else datetime(9999, 12, 31, tzinfo=UTC),
            "before_id": before[1] if before else UUID(int=(1 << 128) - 1),
        }
        name = listing_query(status, agent)
        with self._connection() as conn:
            rows = conn.execute(self.q[name], params).fetchall()
        return [self._index_row(r) for r in rows]

    def failed_ids(
        self, *, agent: str | None, reason: str | None, since: datetime, limit: int
    ) -> list[UUID]:
        """Failed runs that last changed at or after `since`, oldest first."""
        params = {"agent": agent, "reason": reason, "since": since, "limit": limit}
        with self._connection() as conn:
            rows = conn.execute(self.q["select_failed_runs"], params)
            return [r["run_id"] for r in rows]

    def all_rows(self) -> list[RunRow]:
        with self._connection() as conn:
            rows = conn.execute(self.q["select_all_runs"]).fetchall()
        return [self._index_row(r) for r in rows]

    def index_ranges(self, batch: int = RANGE_RUNS) -> Iterator[IndexRange]:
        """The live run index and the index rebuilt from the log, one keyset range of run
        ids at a time (ADR 0040): at most `batch` runs of each per range, both read in one
        REPEATABLE READ snapshot, so writers in between cannot look like drift. A run's row
        and its whole log are always in the same range; each range is a short read. A live
        row that cannot be decoded is reported as such, not read from the log (ADR 0066)."""
        lo: UUID | None = FIRST_ID
        while lo is not None:
            with self._connection() as conn, conn.transaction():
                conn.execute(self.q["snapshot_for_verify"])
                hi = self._range_end(conn, lo, batch)
                bounds = {"lo": lo, "hi": hi}
                rows = conn.execute(self.q["range_runs"], bounds).fetchall()
                rebuilt = list(rebuild_rows(self._log(conn, bounds)))
            live, unreadable = split_unreadable(_index_row, rows, lambda r: r["run_id"])
            yield IndexRange(live, rebuilt, unreadable)
            lo = after(hi)

    def _range_end(self, conn: psycopg.Connection[DictRow], lo: UUID, batch: int) -> UUID:
        ends = []
        for name in ("range_end_runs", "range_end_log"):
            row = conn.execute(self.q[name], {"lo": lo, "skip": batch - 1}).fetchone()
            ends.append(row["run_id"] if row is not None else None)
        return range_end(ends)

    def _log(
        self, conn: psycopg.Connection[DictRow], bounds: dict[str, UUID]
    ) -> Iterator[tuple[UUID, RunEvent, datetime]]:
        """The range's events through a server-side cursor: a range holds a bounded number
        of runs, not of events (a run may have thousands of steps)."""
        with conn.cursor(name="steptrail_log") as cur:
            cur.itersize = 2000
            cur.execute(self.q["range_log"], bounds)
            for r in cur:
                where = f"event {r['version']} of run {r['run_id']}"
                event = decode_event(r["topic"], bytes(r["state"]), where=where)
                yield r["run_id"], event, r["recorded_at"]

    def rebuild_index(
        self, progress: Callable[[int], None] | None = None, *, batch: int = REBUILD_RANGE
    ) -> int:
        """Replace the run index with one folded from the log, one keyset range of run ids
        per short transaction (ADR 0040); writers of other ranges never wait, writers of
        the range wait for that one transaction. Returns the number of runs."""
        count = 0
        lo: UUID | None = FIRST_ID
        while lo is not None:
            hi, done = self._rebuild_range(lo, batch)
            count += done
            if progress is not None:
                progress(count)
            lo = after(hi)
        return count

    def _rebuild_range(self, lo: UUID, batch: int) -> tuple[UUID, int]:
        """Rebuild the rows of one range, atomically against every writer of its runs.

        Lock order, the same as a purge's: the reporting runner's tracking row (so a purge
        and a range never wait for each other's rows), then the index rows of the range in
        id order, and only then the range's log is read. Every writer takes its run's row
        before writing the log, so what the log says of a locked run cannot change until
        this commits: an append waits and then finds the version it expects, a claim skips
        the rows. A run enqueued into the range after the lock keeps the row its enqueue
        wrote with its event (a worker may already have claimed it): only runs that were
        locked are replaced; rows of the log's runs that are missing are inserted."""
        with self._connection() as conn, conn.transaction():
            conn.execute(self.q["init_tracking"], {"projection": PROJECTION})
            conn.execute(self.q["lock_tracking"], {"projection": PROJECTION})
            conn.execute(self.q["lock_as_writer"])
            hi = self._range_end(conn, lo, batch)
            bounds = {"lo": lo, "hi": hi}
            locked = {r["run_id"] for r in conn.execute(self.q["lock_range"], bounds)}
            rows = list(rebuild_rows(self._log(conn, bounds)))
            with conn.cursor() as cur:
                replaced = [self._row_params(r) for r in rows if r.run_id in locked]
                if replaced:
                    cur.executemany(self.q["upsert_row"], replaced)
                missing = [self._row_params(r) for r in rows if r.run_id not in locked]
                if missing:
                    cur.executemany(self.q["insert_missing_row"], missing)
            gone = locked - {r.run_id for r in rows}
            if gone:
                conn.execute(self.q["delete_rows"], {"ids": sorted(gone)})
        return hi, len(rows)

    def _row_params(self, row: RunRow) -> dict[str, Any]:
        params = state_params(row.state)
        params["doc"] = Jsonb(params["doc"])
        params.update(
            lease_expires_at=row.lease_expires_at,
            available_at=row.available_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )
        return params

    def store_now(self) -> Any:
        row = self._one("store_now", {})
        assert row is not None
        return row["now"]

    def _run(self, row: DictRow) -> Run:
        """The run `row` describes, or its log if the row cannot be decoded (ADR 0066)."""
        return readable_run(row["run_id"], lambda: run_from_row(row), self._events)

    def _events(self, run_id: UUID) -> list[RunEvent]:
        return [recorded.event for recorded in self.history(run_id)]

    def _index_row(self, row: DictRow) -> RunRow:
        return _index_row(row, self._run(row))

    def _claimed(self, rows: Sequence[DictRow]) -> list[ClaimedRun]:
        """The runs the `claim` query (or a settle's claim) returned, as the worker takes
        them, leaving out a run unreadable both ways (logged; its lease runs out and the
        reaper finds it, ADR 0066). updated_at is the claim's now(): the run's age is
        measured by the store's clock."""

        def claimed(row: DictRow) -> ClaimedRun:
            return ClaimedRun(
                run=self._run(row),
                request=bytes(row["request"] or b""),
                age_s=max(0.0, (row["updated_at"] - row["created_at"]).total_seconds()),
            )

        return skip_unreadable(claimed, rows)

    def _one(self, name: str, params: dict[str, Any]) -> DictRow | None:
        with self._connection() as conn:
            return conn.execute(self.q[name], params, prepare=True).fetchone()

    # -- retention -------------------------------------------------------------------------------

    def count_purgeable(self, *, statuses: Sequence[str], cutoff: datetime) -> int:
        total = 0
        with self._connection() as conn:
            for status in dict.fromkeys(statuses):
                params = {"status": status, "cutoff": cutoff}
                row = conn.execute(self.q["count_purgeable"], params).fetchone()
                total += int(row["n"]) if row is not None else 0
        return total

    def live_purgeable(self, *, statuses: Sequence[str], cutoff: datetime) -> list[UUID]:
        if RunStatus.RUNNING.value not in statuses:
            return []  # only a running run can be held under a lease
        with self._connection() as conn:
            rows = conn.execute(self.q["select_live_purgeable"], {"cutoff": cutoff})
            return [r["run_id"] for r in rows]

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
        including what each user projection keeps of them (its `forget`).

        Locks the runs' rows (their writers wait, then find them gone) and the tracking rows
        of the reporting runner and of each projection, in a fixed order (no batch may fold
        a run half-purged, or write a purged run's rows back after its `forget`), for one
        small batch only, so live workers wait milliseconds, not the whole purge.
        """
        with self._connection() as conn, conn.transaction():
            conn.execute(self.q["lock_as_writer"])  # the reaper's order (ADR 0054)
            for name in [PROJECTION, *sorted(name for name, _ in projections)]:
                conn.execute(self.q["init_tracking"], {"projection": name})
                conn.execute(self.q["lock_tracking"], {"projection": name})
            ids: list[UUID] = []
            for status in dict.fromkeys(statuses):  # one index walk per status (ADR 0041)
                if len(ids) >= limit:
                    break
                rows = conn.execute(
                    self.q["select_purgeable"],
                    {"status": status, "cutoff": cutoff, "limit": limit - len(ids)},
                ).fetchall()
                ids += [r["run_id"] for r in rows]
            deleted = 0
            if ids:
                params = {"ids": ids, "category": category}
                for statement in statements(self.q["purge_runs"]):
                    deleted = max(deleted, conn.execute(statement.encode("utf-8"), params).rowcount)
                for _, forget in projections:
                    forget(ids, PostgresSql(conn))
        with self._purged_lock:  # no table lost more rows than the batch's largest delete
            self._purged_rows += deleted
        return ids

    def after_purge(self) -> None:
        """VACUUM the tables a purge touched, so the space of deleted content is reclaimed
        now rather than whenever autovacuum comes by (the WAL is the operator's: README),
        with the memory the dead rows need rather than all maintenance_work_mem (ADR 0065)."""
        with self._purged_lock:
            dead, self._purged_rows = self._purged_rows, 0
        with self._connection() as conn:
            conn.autocommit = True
            row = conn.execute(self.q["vacuum_memory"], {"dead": dead}).fetchone()
            conn.execute(self.q["set_vacuum_memory"], {"kb": str(row["kb"]) if row else "1024"})
            try:
                conn.execute(self.q["after_purge"])
            finally:
                conn.execute(self.q["reset_vacuum_memory"])

    def tombstone(self, run_id: UUID) -> tuple[str, datetime] | None:
        row = self._one("select_tombstone", {"run_id": run_id})
        return (row["category"], row["purged_at"]) if row is not None else None

    # -- reporting views (the Dialect of reporting_store) ---------------------------------------

    @contextmanager
    def reporting_write(self) -> Iterator[_PgTx]:
        with self._connection() as conn, conn.transaction():
            yield _PgTx(conn, self.q)

    @contextmanager
    def reporting_read(self) -> Iterator[_PgTx]:
        with self._connection() as conn:
            yield _PgTx(conn, self.q)

    @contextmanager
    def reporting_snapshot(self) -> Iterator[_PgTx]:
        """A REPEATABLE READ, READ ONLY transaction: one snapshot for all its statements."""
        with self._connection() as conn, conn.transaction():
            conn.execute(self.q["snapshot_for_verify"])
            yield _PgTx(conn, self.q)

    @contextmanager
    def scratch(self) -> Iterator[Callable[[], AbstractContextManager[_PgTx]]]:
        """A private schema to rebuild a projection into (`verify`), on a connection of its
        own whose search path holds only that schema, so the projection's unqualified table
        names resolve to the scratch copies; yields a function that opens a transaction on
        it. Each transaction is short (a batch): a long one would hold every reader of the
        log back (ADR 0012). The schema is dropped at the end."""
        schema = f"steptrail_scratch_{uuid4().hex[:12]}"
        try:
            conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
        except _CONNECTION_ERRORS as e:
            raise StoreUnavailable(_first_line(e)) from e
        try:
            conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(schema)))
            conn.execute(pgsql.SQL("SET search_path TO {}").format(pgsql.Identifier(schema)))

            @contextmanager
            def transaction() -> Iterator[_PgTx]:
                with conn.transaction():
                    yield _PgTx(conn, self.q)

            yield transaction
        finally:
            with suppress(psycopg.Error):
                conn.execute(
                    pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema))
                )
            conn.close()

    @staticmethod
    def db_id(value: UUID) -> Any:
        return value

    @staticmethod
    def db_ids(values: Sequence[UUID]) -> Any:
        return list(values)

    @staticmethod
    def db_time(value: datetime | None) -> Any:
        return value

    @staticmethod
    def py_time(value: Any) -> datetime | None:
        return value  # type: ignore[no-any-return]

    @staticmethod
    def db_json(value: Any) -> Any:
        return Jsonb(value)

    @staticmethod
    def db_now() -> Any:
        return None  # PostgreSQL reads now() inside the query

    def held_back(self, *, agents: Sequence[str], queues: Sequence[str] | None = None) -> bool:
        """Whether a run of `agents` and `queues` with a concurrency key is due but waits
        for a place under its key's limit (ADR 0078; burst mode waits for it)."""
        params = {
            "agents": list(dict.fromkeys(agents)),
            "queues": None if queues is None else list(dict.fromkeys(queues)),
        }
        return self._one("keyed_held_back", params) is not None

    # -- waking idle workers -------------------------------------------------------------------

    def wait_for_work(self, timeout: float) -> bool:
        if self._listener is None:
            self._listener = threading.Thread(
                target=self._listen, name="steptrail-listen", daemon=True
            )
            self._listener.start()
        woken = self._woken.wait(timeout)
        self._woken.clear()
        return woken

    def wake(self) -> None:
        self._woken.set()

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


class _PgTx:
    """Named queries on one connection (inside a transaction when writing)."""

    def __init__(self, conn: psycopg.Connection[DictRow], q: dict[str, str]) -> None:
        self.conn = conn
        self.q = q

    def all(self, name: str, params: Mapping[str, Any]) -> list[Any]:
        return self.conn.execute(self.q[name], params).fetchall()

    def run(self, name: str, params: Mapping[str, Any]) -> None:
        for statement in statements(self.q[name]):
            self.conn.execute(statement.encode("utf-8"), params)

    def many(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        if params:
            with self.conn.cursor() as cur:
                cur.executemany(self.q[name], params)

    def sql(self) -> PostgresSql:
        """The handle a user projection writes through, on this transaction."""
        return PostgresSql(self.conn)

    def rows_of(self, table: str) -> list[tuple[Any, ...]]:
        return postgres_rows_of(self.conn, table)

    def drop(self, table: str) -> None:
        postgres_drop(self.conn, table)


# copy_runs' columns, in its order (upsert_row's parameters).
_ROW_COLUMNS = (
    "run_id", "agent", "status", "version", "segment", "holder", "lease_ms", "claim_version",
    "requeue_count", "reason", "idempotency_key", "doc",
    "lease_expires_at", "available_at", "created_at", "updated_at", "queue", "priority",
    "concurrency_key", "concurrency_limit",
)  # fmt: skip

# insert_runs' parameters: one array per column, named after the single insert's parameter.
_MANY_COLUMNS = {
    "run_id": "run_ids",
    "agent": "agents",
    "status": "statuses",
    "version": "versions",
    "segment": "segments",
    "holder": "holders",
    "lease_ms": "lease_mss",
    "claim_version": "claim_versions",
    "requeue_count": "requeue_counts",
    "reason": "reasons",
    "idempotency_key": "keys",
    "doc": "docs",
    "retry_delay_ms": "retry_delay_mss",
    "topic": "topics",
    "state": "states",
    "request": "requests",
    "queue": "queues",
    "priority": "priorities",
    "parent_id": "parent_ids",
    "concurrency_key": "concurrency_keys",
    "concurrency_limit": "concurrency_limits",
}


def _index_row(row: DictRow, run: Run | None = None) -> RunRow:
    """The row as the run index describes it; the run's state is `run`'s if given (read from
    the log when the row could not be), else decoded from the row."""
    return RunRow(
        state=(run if run is not None else run_from_row(row)).state,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        lease_expires_at=row["lease_expires_at"],
        available_at=row["available_at"],
    )


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
