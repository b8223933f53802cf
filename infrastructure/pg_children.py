"""PostgreSQL: a child's settling append and its parent's signal in one transaction, and
the children of a run (ADR 0075; see `children_store.py`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol
from uuid import UUID

import psycopg
from psycopg.rows import DictRow

from steptrail.domain.children import child_signal
from steptrail.domain.run import Run
from steptrail.infrastructure.children_store import tell
from steptrail.infrastructure.pg_signals import insert_signal
from steptrail.projections.run_index import RunRow


class _PgStore(Protocol):
    q: Any

    def _connection(self) -> AbstractContextManager[psycopg.Connection[DictRow]]: ...

    def _index_row(self, row: DictRow) -> RunRow: ...

    def append_statement(
        self, run: Run, *, resumable: bytes | None = None
    ) -> tuple[str, dict[str, Any]]: ...


class PostgresChildren:
    """Child runs on PostgreSQL: the child's row is locked by its append, then the parent's."""

    def children(self: _PgStore, run_id: UUID) -> list[RunRow]:
        with self._connection() as conn:
            rows = conn.execute(self.q["select_children"], {"run_id": run_id}).fetchall()
        return [self._index_row(r) for r in rows]

    def settle_child(
        self: _PgStore, run: Run, *, resumable: bytes | None, keep_request: bool
    ) -> None:
        """A child's settling append and its parent's signal (and wake-up), one transaction:
        one round trip more than a plain settle, on a child's last write only."""
        name, params = self.append_statement(run, resumable=resumable)
        parent: Run | None = None
        parent_id = run.state.parent_id
        assert parent_id is not None
        with self._connection() as conn, conn.transaction():
            conn.execute(self.q[name], params, prepare=True)
            if keep_request:
                conn.execute(self.q["drop_saved_but_request"], {"run_id": run.id})
            conn.execute(self.q["lock_run_row"], {"run_id": parent_id})
            row = conn.execute(self.q["select_run"], {"run_id": parent_id}).fetchone()

            def store_signal(payload: bytes) -> int:
                return insert_signal(
                    conn,
                    self.q,
                    parent_id,
                    name=child_signal(run.id),
                    payload=payload,
                    sent_by=f"child:{run.id}",
                )

            parent = tell(row, run, store_signal)
            if parent is not None:
                statement, woke = self.append_statement(parent)
                conn.execute(self.q[statement], woke)
        run.mark_committed()
        if parent is not None:
            parent.mark_committed()
