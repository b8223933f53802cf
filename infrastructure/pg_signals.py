"""PostgreSQL: the inbox of signals and the suspending append that reads it (ADR 0073).

A mixin of `PostgresRunStore`: the statements are named queries of `queries.sql`; the
store's connection pool, error mapping and append statement are the store's own.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol
from uuid import UUID

import psycopg
from psycopg.rows import DictRow

from steptrail.domain.errors import UnknownRun, VersionConflict
from steptrail.domain.run import Run
from steptrail.domain.waits import Signal, SignalArrived, SignalGuard, guard_names


def insert_signal(
    conn: psycopg.Connection[DictRow],
    q: Any,
    run_id: UUID,
    *,
    name: str,
    payload: bytes,
    sent_by: str,
) -> int:
    """Store a signal at the end of `run_id`'s inbox (in the caller's transaction, which
    holds the run's row lock); its number."""
    row = conn.execute(q["next_signal_seq"], {"run_id": run_id}).fetchone()
    seq = int(row["seq"]) if row is not None else 1
    conn.execute(
        q["insert_signal"],
        {"run_id": run_id, "seq": seq, "name": name, "payload": payload, "sent_by": sent_by},
    )
    return seq


class _Store(Protocol):
    q: Any

    def _connection(self) -> AbstractContextManager[psycopg.Connection[DictRow]]: ...

    def append_statement(
        self, run: Run, *, resumable: bytes | None = None
    ) -> tuple[str, dict[str, Any]]: ...


class PostgresSignals:
    """Signals on PostgreSQL (see the module docstring)."""

    def next_signal(self: _Store, run_id: UUID, name: str, after_seq: int) -> Signal | None:
        with self._connection() as conn:
            row = conn.execute(
                self.q["select_next_signal"],
                {"run_id": run_id, "name": name, "after": after_seq},
            ).fetchone()
        return _signal(row) if row is not None else None

    def signals(self: _Store, run_id: UUID) -> list[dict[str, Any]]:
        """The run's inbox, oldest first: number, name, sender, time and payload size."""
        with self._connection() as conn:
            return [dict(r) for r in conn.execute(self.q["select_signals"], {"run_id": run_id})]

    def deliver_signal(
        self: _Store,
        run: Run,
        *,
        name: str,
        payload: bytes,
        sent_by: str,
        wake: Callable[[int], Run | None],
    ) -> int:
        woken: Run | None = None
        with self._connection() as conn, conn.transaction():
            _lock_row(self, conn, run)
            seq = insert_signal(conn, self.q, run.id, name=name, payload=payload, sent_by=sent_by)
            woken = wake(seq)
            if woken is not None and woken.pending_events:
                statement, params = self.append_statement(woken)
                conn.execute(self.q[statement], params)
        if woken is not None:
            woken.mark_committed()
        return seq

    def append_guarded(self: _Store, run: Run, guard: SignalGuard, resumable: bytes | None) -> None:
        """The suspending append of a signal wait: nothing is written if the signal is in
        the inbox already (SignalArrived), the row being locked before the inbox is read."""
        with self._connection() as conn, conn.transaction():
            _lock_row(self, conn, run)
            found = []
            for name, after in guard_names(guard):
                row = conn.execute(
                    self.q["select_next_signal"], {"run_id": run.id, "name": name, "after": after}
                ).fetchone()
                found += [_signal(row)] if row is not None else []
            if found:
                raise SignalArrived(min(found, key=lambda signal: signal.seq))
            statement, params = self.append_statement(run, resumable=resumable)
            conn.execute(self.q[statement], params)
        run.mark_committed()


def _lock_row(store: _Store, conn: psycopg.Connection[DictRow], run: Run) -> None:
    """Lock `run`'s row the way every writer does (the run index first, ADR 0054) and check
    that it is still at the version `run` was loaded at."""
    conn.execute(store.q["lock_as_writer"])
    row = conn.execute(store.q["lock_run_row"], {"run_id": run.id}).fetchone()
    if row is None:
        raise UnknownRun(f"no run {run.id}")
    if int(row["version"]) != run.committed_version:
        raise VersionConflict(f"run {run.id} moved on (now at version {row['version']})")


def _signal(row: DictRow) -> Signal:
    return Signal(seq=int(row["seq"]), name=str(row["name"]), payload=bytes(row["payload"]))
