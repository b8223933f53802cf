"""Child runs in the stores (ADR 0075): the settling child tells its parent, in its own
transaction, and the children of a run are an index read.

`SQLiteChildren` (here) and `PostgresChildren` (`pg_children.py`) are mixins of the two
stores. A child's settling
append (completed, failed for good, cancelled, dead-lettered) locks the child's row (the
append itself), then the parent's, stores the signal `steptrail.child:<child id>` in the
parent's inbox with what the parent needs (`domain.children.settlement`), and, if the
parent waits for it, appends `Woken` to the parent at its version — all in one
transaction, so there is no moment at which a child has settled and its parent cannot learn
it. Children before parents is the lock order every writer of a family follows. A parent
that has settled (or been purged) is told nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from steptrail.domain.children import child_signal, settlement
from steptrail.domain.digest import canonical_json
from steptrail.domain.run import Run
from steptrail.domain.waits import waits_for, wake
from steptrail.infrastructure.store_base import RowLike, run_from_row
from steptrail.projections.run_index import RunRow

if TYPE_CHECKING:  # the PostgreSQL store imports this module too, and never sqlite3
    import sqlite3


def tell(
    parent_row: RowLike | None, child: Run, store_signal: Callable[[bytes], int]
) -> Run | None:
    """The parent to append `Woken` to, once the child's signal is stored (None: nobody to
    wake). `store_signal` stores the payload in the parent's inbox and returns its number."""
    if parent_row is None:
        return None  # purged before its child settled: show says so (ADR 0075)
    parent = run_from_row(parent_row)
    if parent.status.is_terminal:
        return None
    name = child_signal(child.id)
    seq = store_signal(canonical_json(settlement(child)))
    if not waits_for(parent.state, name):
        return None
    wake(parent, actor=f"child:{child.id}", name=name, signal_seq=seq)
    return parent


class _SQLiteStore(Protocol):
    q: Any

    def _read(self) -> AbstractContextManager[sqlite3.Cursor]: ...

    def _index_row(self, row: sqlite3.Row) -> RunRow: ...

    def append_in(
        self, cur: sqlite3.Cursor, at: int, run: Run, resumable: bytes | None
    ) -> None: ...


class SQLiteChildren:
    """Child runs on SQLite: the database's one write transaction is the family's lock."""

    def children(self: _SQLiteStore, run_id: UUID) -> list[RunRow]:
        with self._read() as cur:
            cur.execute(self.q["select_children"], {"run_id": run_id.hex})
            rows = cur.fetchall()
        return [self._index_row(r) for r in rows]

    def tell_parent(self: _SQLiteStore, cur: sqlite3.Cursor, at: int, child: Run) -> Run | None:
        """Inside the child's settling write: the parent's signal, and its wake-up."""
        from steptrail.infrastructure.sqlite_signals import insert_signal  # imports sqlite3

        parent_id = child.state.parent_id
        assert parent_id is not None
        cur.execute(self.q["select_run"], {"run_id": parent_id.hex})
        row = cur.fetchone()

        def store_signal(payload: bytes) -> int:
            return insert_signal(
                cur,
                self.q,
                parent_id,
                name=child_signal(child.id),
                payload=payload,
                sent_by=f"child:{child.id}",
                at=at,
            )

        parent = tell(row, child, store_signal)
        if parent is not None:
            self.append_in(cur, at, parent, None)
        return parent
