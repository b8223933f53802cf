"""SQLite: the inbox of signals and the suspending append that reads it (ADR 0073).

A mixin of `SQLiteRunStore`. Every write runs in the database's one write transaction
(BEGIN IMMEDIATE), which serialises a signal's delivery with a suspending append as
PostgreSQL's row lock does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from steptrail.domain.errors import UnknownRun, VersionConflict
from steptrail.domain.run import Run
from steptrail.domain.waits import Signal, SignalArrived, SignalGuard, guard_names

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def insert_signal(
    cur: sqlite3.Cursor,
    q: Any,
    run_id: UUID,
    *,
    name: str,
    payload: bytes,
    sent_by: str,
    at: int,
) -> int:
    """Store a signal at the end of `run_id`'s inbox (in the caller's write); its number."""
    cur.execute(q["next_signal_seq"], {"run_id": run_id.hex})
    seq = int(cur.fetchone()["seq"])
    cur.execute(
        q["insert_signal"],
        {
            "run_id": run_id.hex,
            "seq": seq,
            "name": name,
            "payload": payload,
            "sent_by": sent_by,
            "at": at,
        },
    )
    return seq


class _Store(Protocol):
    q: Any

    def _write(self) -> AbstractContextManager[tuple[sqlite3.Cursor, int]]: ...

    def _read(self) -> AbstractContextManager[sqlite3.Cursor]: ...

    def append(
        self,
        run: Run,
        *,
        resumable: bytes | None = None,
        then_claim: Any = None,
        unless_signal: SignalGuard | None = None,
    ) -> list[Any]: ...

    def append_in(
        self, cur: sqlite3.Cursor, at: int, run: Run, resumable: bytes | None
    ) -> None: ...


class SQLiteSignals:
    """Signals on SQLite (see the module docstring)."""

    def next_signal(self: _Store, run_id: UUID, name: str, after_seq: int) -> Signal | None:
        with self._read() as cur:
            cur.execute(
                self.q["select_next_signal"],
                {"run_id": run_id.hex, "name": name, "after": after_seq},
            )
            row = cur.fetchone()
        return _signal(row) if row is not None else None

    def signals(self: _Store, run_id: UUID) -> list[dict[str, Any]]:
        """The run's inbox, oldest first: number, name, sender, time and payload size."""
        with self._read() as cur:
            cur.execute(self.q["select_signals"], {"run_id": run_id.hex})
            rows = [dict(r) for r in cur.fetchall()]
        for row in rows:
            row["sent_at"] = _EPOCH + timedelta(microseconds=row["sent_at"])
        return rows

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
        with self._write() as (cur, at):
            _check_version(self, cur, run)
            seq = insert_signal(
                cur, self.q, run.id, name=name, payload=payload, sent_by=sent_by, at=at
            )
            woken = wake(seq)
            if woken is not None and woken.pending_events:
                self.append_in(cur, at, woken, None)
        if woken is not None:
            woken.mark_committed()
        return seq

    def append_guarded(self: _Store, run: Run, guard: SignalGuard, resumable: bytes | None) -> None:
        """The suspending append of a signal wait: nothing is written if the signal is in
        the inbox already (SignalArrived)."""
        with self._write() as (cur, at):
            _check_version(self, cur, run)
            found = []
            for name, after in guard_names(guard):
                cur.execute(
                    self.q["select_next_signal"],
                    {"run_id": run.id.hex, "name": name, "after": after},
                )
                row = cur.fetchone()
                found += [_signal(row)] if row is not None else []
            if found:
                raise SignalArrived(min(found, key=lambda signal: signal.seq))
            self.append_in(cur, at, run, resumable)
        run.mark_committed()


def _check_version(store: _Store, cur: sqlite3.Cursor, run: Run) -> None:
    cur.execute(store.q["lock_run_row"], {"run_id": run.id.hex})
    row = cur.fetchone()
    if row is None:
        raise UnknownRun(f"no run {run.id}")
    if int(row["version"]) != run.committed_version:
        raise VersionConflict(f"run {run.id} moved on (now at version {row['version']})")


def _signal(row: sqlite3.Row) -> Signal:
    return Signal(seq=int(row["seq"]), name=str(row["name"]), payload=bytes(row["payload"]))
