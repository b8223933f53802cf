"""The SQLite store's work on many runs at once: `create_many`, the benchmark loader, the
run index's rebuild and keyset ranges (ADR 0040), and retention's purge (ADR 0041)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from steptrail.domain.enums import RunStatus
from steptrail.domain.run import Run, RunEvent
from steptrail.infrastructure.codec import decode_event
from steptrail.infrastructure.sqlfiles import statements
from steptrail.infrastructure.sqlite_connections import (
    _hex,
    to_datetime,
    to_us,
)
from steptrail.infrastructure.sqlite_reads import _index_row
from steptrail.infrastructure.sqlite_writes import SQLiteWrites
from steptrail.infrastructure.store_base import (
    FIRST_ID,
    RANGE_RUNS,
    REBUILD_RANGE,
    REQUEST,
    after,
    range_end,
    settled_load,
    side_effects,
    split_unreadable,
    state_params,
)
from steptrail.infrastructure.user_sql import SqliteSql
from steptrail.projections.custom import PurgeHook
from steptrail.projections.run_index import (
    IndexRange,
    RunRow,
    rebuild_rows,
)


class SQLiteBulk(SQLiteWrites):
    """Bulk work of `SQLiteRunStore` (see the module docstring)."""

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
