"""Schedules in both stores (ADR 0076): mixins of `SQLiteRunStore` and `PostgresRunStore`.

The statements are named queries of each backend's `queries.sql`. Every instant is the
store's clock: a schedule's first tick is computed from it when the schedule is defined,
and "due" is judged by it, so schedulers on machines whose clocks disagree fire the same
ticks.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from steptrail.domain.schedules import (
    Missed,
    Schedule,
    ScheduleRow,
    UnknownSchedule,
    same_definition,
)

if TYPE_CHECKING:  # a PostgreSQL process never imports sqlite3 (ADR 0051)
    import sqlite3

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _us(when: datetime) -> int:
    return (when - _EPOCH) // timedelta(microseconds=1)


def _at(us: int | None) -> datetime | None:
    return None if us is None else _EPOCH + timedelta(microseconds=us)


def _row(cells: Any, *, sqlite: bool) -> ScheduleRow:
    schedule = Schedule(
        name=cells["name"],
        cron=cells["cron"],
        agent=cells["agent"],
        request=json.loads(cells["request"]),
        missed=Missed(cells["missed"]),
        grace_s=int(cells["grace_ms"]) / 1000,
    )
    if sqlite:
        last_run = cells["last_run_id"]
        return ScheduleRow(
            schedule=schedule,
            paused=bool(cells["paused"]),
            next_tick_at=_EPOCH + timedelta(microseconds=int(cells["next_tick_at"])),
            last_tick_at=_at(cells["last_tick_at"]),
            last_run_id=UUID(hex=last_run) if last_run else None,
            updated_by=cells["updated_by"],
        )
    return ScheduleRow(
        schedule=schedule,
        paused=bool(cells["paused"]),
        next_tick_at=cells["next_tick_at"],
        last_tick_at=cells["last_tick_at"],
        last_run_id=cells["last_run_id"],
        updated_by=cells["updated_by"],
    )


def _definition(schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "agent": schedule.agent,
        "request": schedule.request_json,
        "missed": schedule.missed.value,
        "grace_ms": round(schedule.grace_s * 1000),
    }


class _SQLite(Protocol):
    q: Any

    def _write(self) -> AbstractContextManager[tuple[sqlite3.Cursor, int]]: ...

    def _read(self) -> AbstractContextManager[sqlite3.Cursor]: ...

    def now_us(self) -> int: ...


class SQLiteSchedules:
    def schedule_rows(self: _SQLite) -> list[ScheduleRow]:
        with self._read() as cur:
            cur.execute(self.q["select_schedules"])
            return [_row(r, sqlite=True) for r in cur.fetchall()]

    def define_schedule(self: _SQLite, schedule: Schedule, *, by: str) -> ScheduleRow:
        """Keep `schedule` as code defines it: insert it (its first tick after now), or
        update a changed definition (a changed cron restarts from now); paused stays."""
        with self._write() as (cur, at):
            cur.execute(self.q["select_schedule"], {"name": schedule.name})
            found = cur.fetchone()
            now = _EPOCH + timedelta(microseconds=at)
            params = {**_definition(schedule), "at": at, "by": by}
            if found is None:
                params["next_tick_at"] = _us(schedule.first_tick(now))
                cur.execute(self.q["insert_schedule"], params)
            else:
                kept = _row(found, sqlite=True)
                if same_definition(kept, schedule):
                    return kept
                next_at = kept.next_tick_at
                if kept.schedule.cron != schedule.cron:
                    next_at = schedule.first_tick(now)
                params["next_tick_at"] = _us(next_at)
                cur.execute(self.q["update_schedule_definition"], params)
            cur.execute(self.q["select_schedule"], {"name": schedule.name})
            return _row(cur.fetchone(), sqlite=True)

    def due_schedules(self: _SQLite, limit: int) -> tuple[datetime, list[ScheduleRow]]:
        now = self.now_us()
        with self._read() as cur:
            cur.execute(self.q["due_schedules"], {"now": now, "limit": limit})
            rows = [_row(r, sqlite=True) for r in cur.fetchall()]
        return _EPOCH + timedelta(microseconds=now), rows

    def advance_schedule(
        self: _SQLite,
        name: str,
        *,
        expected: datetime,
        next_tick_at: datetime,
        last_tick_at: datetime | None,
        last_run_id: UUID | None,
    ) -> bool:
        with self._write() as (cur, at):
            cur.execute(
                self.q["advance_schedule"],
                {
                    "name": name,
                    "expected": _us(expected),
                    "next_tick_at": _us(next_tick_at),
                    "last_tick_at": _us(last_tick_at) if last_tick_at else None,
                    "last_run_id": last_run_id.hex if last_run_id else None,
                    "at": at,
                },
            )
            return cur.rowcount == 1

    def pause_schedule(self: _SQLite, name: str, *, paused: bool, by: str) -> ScheduleRow:
        with self._write() as (cur, at):
            cur.execute(
                self.q["pause_schedule"], {"name": name, "paused": int(paused), "at": at, "by": by}
            )
            cur.execute(self.q["select_schedule"], {"name": name})
            found = cur.fetchone()
        if found is None:
            raise UnknownSchedule(f"no schedule {name!r}")
        return _row(found, sqlite=True)


class _Postgres(Protocol):
    q: Any

    def _connection(self) -> AbstractContextManager[Any]: ...


class PostgresSchedules:
    def schedule_rows(self: _Postgres) -> list[ScheduleRow]:
        with self._connection() as conn:
            return [_row(r, sqlite=False) for r in conn.execute(self.q["select_schedules"])]

    def define_schedule(self: _Postgres, schedule: Schedule, *, by: str) -> ScheduleRow:
        """See `SQLiteSchedules.define_schedule`; the row is locked while it is compared."""
        with self._connection() as conn, conn.transaction():
            params = {**_definition(schedule), "by": by}
            now = conn.execute(self.q["store_now"]).fetchone()["now"]
            params["next_tick_at"] = schedule.first_tick(now)
            conn.execute(self.q["insert_schedule"], params)  # nothing if it exists
            found = conn.execute(self.q["select_schedule"], {"name": schedule.name}).fetchone()
            kept = _row(found, sqlite=False)
            if same_definition(kept, schedule):
                return kept
            if kept.schedule.cron == schedule.cron:
                params["next_tick_at"] = kept.next_tick_at
            conn.execute(self.q["update_schedule_definition"], params)
            found = conn.execute(self.q["select_schedule"], {"name": schedule.name}).fetchone()
            return _row(found, sqlite=False)

    def due_schedules(self: _Postgres, limit: int) -> tuple[datetime, list[ScheduleRow]]:
        with self._connection() as conn:
            cells = conn.execute(self.q["due_schedules"], {"limit": limit}).fetchall()
            if cells:
                return cells[0]["store_now"], [_row(r, sqlite=False) for r in cells]
            return conn.execute(self.q["store_now"]).fetchone()["now"], []

    def advance_schedule(
        self: _Postgres,
        name: str,
        *,
        expected: datetime,
        next_tick_at: datetime,
        last_tick_at: datetime | None,
        last_run_id: UUID | None,
    ) -> bool:
        with self._connection() as conn:
            done = conn.execute(
                self.q["advance_schedule"],
                {
                    "name": name,
                    "expected": expected,
                    "next_tick_at": next_tick_at,
                    "last_tick_at": last_tick_at,
                    "last_run_id": last_run_id,
                },
            )
            return bool(done.rowcount == 1)

    def pause_schedule(self: _Postgres, name: str, *, paused: bool, by: str) -> ScheduleRow:
        with self._connection() as conn:
            found = conn.execute(
                self.q["pause_schedule"], {"name": name, "paused": paused, "by": by}
            ).fetchone()
        if found is None:
            raise UnknownSchedule(f"no schedule {name!r}")
        return _row(found, sqlite=False)
