"""The PostgreSQL store's work on many runs at once: `create_many`, the benchmark loader, the
run index's rebuild and keyset ranges (ADR 0040), and retention's purge (ADRs 0041, 0065)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from steptrail.domain.enums import RunStatus
from steptrail.domain.run import Run, RunEvent
from steptrail.infrastructure.codec import decode_event
from steptrail.infrastructure.pg_reads import _index_row
from steptrail.infrastructure.pg_writes import PostgresWrites
from steptrail.infrastructure.reporting_store import PROJECTION
from steptrail.infrastructure.sqlfiles import statements
from steptrail.infrastructure.store_base import (
    FIRST_ID,
    RANGE_RUNS,
    REBUILD_RANGE,
    REQUEST,
    after,
    encoded_events,
    range_end,
    settled_load,
    split_unreadable,
    state_params,
)
from steptrail.infrastructure.user_sql import PostgresSql
from steptrail.projections.custom import PurgeHook
from steptrail.projections.run_index import (
    IndexRange,
    RunRow,
    rebuild_rows,
)

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


class PostgresBulk(PostgresWrites):
    """Bulk work of `PostgresRunStore` (see the module docstring)."""

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
