"""The SQLite store's claims: a batch claimed in one write transaction (queues and
priorities: `sqlite_queues`, concurrency keys: `sqlite_keys`) and the Claimed fold done
outside the write lock."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from uuid import UUID

from steptrail.domain.ports import ClaimedRun, ClaimRequest
from steptrail.domain.run import Run
from steptrail.infrastructure.sqlite_queues import pick as pick_claimable
from steptrail.infrastructure.sqlite_reads import SQLiteReads
from steptrail.infrastructure.store_base import (
    claimed_event,
    readable_run,
    run_from_row,
    skip_unreadable,
)


class SQLiteClaims(SQLiteReads):
    """Claims of `SQLiteRunStore` (see the module docstring)."""

    def _claim(self, request: ClaimRequest) -> list[ClaimedRun]:
        """`claim_batch` (`store_base.Claims`): one write transaction."""
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
