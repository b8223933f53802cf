"""The SQLite store's reads: one run, its row, saved bodies, journal and history, the stale
scan, listings (ADR 0066: a row that cannot be decoded is read from the log), and whether
burst mode must wait (`held_back`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from steptrail.domain.journal import JournalEntry
from steptrail.domain.ports import RecordedEvent
from steptrail.domain.run import Run, RunEvent
from steptrail.infrastructure.codec import decode_event
from steptrail.infrastructure.sqlite_connections import (
    SQLiteStoreBase,
    journal_from_cells,
    to_datetime,
    to_us,
)
from steptrail.infrastructure.store_base import (
    REQUEST,
    listing_query,
    readable_run,
    run_from_row,
)
from steptrail.projections.run_index import (
    RunRow,
)


class SQLiteReads(SQLiteStoreBase):
    """Reads of `SQLiteRunStore` (see the module docstring)."""

    def _run(self, row: sqlite3.Row) -> Run:
        """The run `row` describes, or its log if the row cannot be decoded (ADR 0066)."""
        return readable_run(UUID(row["run_id"]), lambda: run_from_row(row), self._events)

    def _events(self, run_id: UUID) -> list[RunEvent]:
        return [recorded.event for recorded in self.history(run_id)]

    def _index_row(self, row: sqlite3.Row) -> RunRow:
        return _index_row(row, self._run(row))

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

    def tombstone(self, run_id: UUID) -> tuple[str, datetime] | None:
        row = self._one("select_tombstone", {"run_id": run_id.hex})
        if row is None:
            return None
        return row["category"], to_datetime(row["purged_at"]) or datetime.now(UTC)

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
        with self._read() as cur:
            now = self.now_us()
            params = {
                "agents": json.dumps(list(dict.fromkeys(agents))),
                "queues": None if queues is None else json.dumps(list(dict.fromkeys(queues))),
                "now": now,
                "until": now + round(rate_horizon_s * 1e6),
            }
            return cur.execute(self.q["held_back"], params).fetchone() is not None


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
