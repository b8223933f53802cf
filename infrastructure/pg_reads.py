"""The PostgreSQL store's reads: one run, its row, saved bodies, journal and history, the
stale scan, listings (ADR 0066: a row that cannot be decoded is read from the log), and whether
burst mode must wait (`held_back`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from psycopg.rows import DictRow

from steptrail.domain.journal import JournalEntry
from steptrail.domain.ports import RecordedEvent
from steptrail.domain.run import Run, RunEvent
from steptrail.infrastructure.codec import decode_event
from steptrail.infrastructure.pg_connections import (
    PostgresStoreBase,
)
from steptrail.infrastructure.store_base import (
    REQUEST,
    journal_from_rows,
    listing_query,
    readable_run,
    run_from_row,
)
from steptrail.projections.run_index import (
    RunRow,
)


class PostgresReads(PostgresStoreBase):
    """Reads of `PostgresRunStore` (see the module docstring)."""

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

    def _one(self, name: str, params: dict[str, Any]) -> DictRow | None:
        with self._connection() as conn:
            return conn.execute(self.q[name], params, prepare=True).fetchone()

    def tombstone(self, run_id: UUID) -> tuple[str, datetime] | None:
        row = self._one("select_tombstone", {"run_id": run_id})
        return (row["category"], row["purged_at"]) if row is not None else None

    def held_back(
        self,
        *,
        agents: Sequence[str],
        queues: Sequence[str] | None = None,
        rate_horizon_s: float = 0.0,
    ) -> bool:
        """Whether a run of `agents` and `queues` with a concurrency key is due but waits
        for a place under its key's limit (ADR 0078), or sleeps on its rate limit and wakes
        within `rate_horizon_s` (ADR 0083): burst mode waits for both."""
        params = {
            "agents": list(dict.fromkeys(agents)),
            "queues": None if queues is None else list(dict.fromkeys(queues)),
            "horizon_us": round(rate_horizon_s * 1e6),
        }
        return self._one("held_back", params) is not None


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
