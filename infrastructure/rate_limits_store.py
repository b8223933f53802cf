"""Rate limits in both stores (ADR 0080): mixins of `SQLiteRunStore` and `PostgresRunStore`.

An acquire is one transaction that holds the limit's lock (SQLite: the IMMEDIATE write
transaction; PostgreSQL: `SELECT ... FOR UPDATE` of the limit's row), reads the store's clock
*after* taking it, drops the grants that left the window, reads the ones in it and, if
`decide` allows, appends the new grant stamped with that clock. Acquirers of one limit are
therefore decided one at a time, each seeing every grant given before it, in the order they
were given: the window can be exact whatever the number of workers and machines.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from steptrail.domain.rate_limits import (
    RateAnswer,
    RateLimit,
    RateLimitRow,
    UnknownRateLimit,
    decide,
    fits,
)
from steptrail.infrastructure.schedules_store import _EPOCH, _us

if TYPE_CHECKING:  # a PostgreSQL process never imports sqlite3 (ADR 0051)
    import sqlite3


def _limit(cells: Any) -> RateLimit:
    return RateLimit(
        name=cells["name"],
        requests=cells["requests"],
        tokens=cells["tokens"],
        per_s=int(cells["per_ms"]) / 1000,
        margin_s=int(cells["margin_ms"]) / 1000,
    )


def _definition(limit: RateLimit, by: str) -> dict[str, Any]:
    return {
        "name": limit.name,
        "requests": limit.requests,
        "tokens": limit.tokens,
        "per_ms": limit.per_ms,
        "margin_ms": limit.margin_ms,
        "by": by,
    }


def _use(limit: RateLimit, use: Any, tokens: int, now: int, blocked: int | None) -> bool:
    """Whether the window's totals (`window_rate_use`) let a grant of `tokens` through now."""
    return fits(
        limit,
        grants=int(use["grants"]),
        held=int(use["held"]),
        tokens=tokens,
        now_us=now,
        blocked_until_us=blocked,
    )


def _wait(limit: RateLimit, rows: Any, tokens: int, now: int, blocked: int | None) -> RateAnswer:
    """The wait the grants of the window (oldest first, `(µs, tokens)`) ask for."""
    at = decide(limit, rows, now_us=now, tokens=tokens, blocked_until_us=blocked)
    return RateAnswer(grant_id=None, wait_s=max(at - now, 1) / 1_000_000)


class _SQLite(Protocol):
    q: Any

    def _write(self) -> AbstractContextManager[tuple[sqlite3.Cursor, int]]: ...

    def _read(self) -> AbstractContextManager[sqlite3.Cursor]: ...

    def now_us(self) -> int: ...


class SQLiteRateLimits:
    def define_rate_limits(self: _SQLite, limits: Iterable[RateLimit], *, by: str) -> None:
        """Store each limit as code defines it (a changed one is updated; a block stays)."""
        with self._write() as (cur, at):
            for limit in limits:
                cur.execute(self.q["define_rate_limit"], {**_definition(limit, by), "at": at})

    def rate_limit_rows(self: _SQLite) -> list[RateLimitRow]:
        with self._read() as cur:
            cur.execute(self.q["select_rate_limits"], {"now": self.now_us()})
            return [
                RateLimitRow(
                    limit=_limit(r),
                    used_requests=int(r["used_requests"]),
                    used_tokens=int(r["used_tokens"]),
                    blocked_until=(
                        None
                        if r["blocked_until"] is None
                        else _EPOCH + timedelta(microseconds=int(r["blocked_until"]))
                    ),
                    updated_by=r["updated_by"],
                )
                for r in cur.fetchall()
            ]

    def acquire_rate(self: _SQLite, name: str, tokens: int, run_id: UUID) -> RateAnswer:
        """A grant of `tokens` under limit `name` now, or how long to wait for one.

        Raises:
            UnknownRateLimit: the store keeps no limit of that name.
        """
        with self._write() as (cur, now):
            cur.execute(self.q["lock_rate_limit"], {"name": name})
            found = cur.fetchone()
            if found is None:
                raise UnknownRateLimit(f"the store keeps no rate limit {name!r}")
            limit = _limit(found)
            window = {"name": name, "now": now, "window_us": limit.window_us}
            blocked = found["blocked_until"]
            cur.execute(self.q["prune_rate_grants"], window)
            cur.execute(self.q["window_rate_use"], window)
            if not _use(limit, cur.fetchone(), tokens, now, blocked):
                cur.execute(self.q["window_rate_grants"], window)
                rows = [(int(r["granted_at"]), int(r["tokens"])) for r in cur.fetchall()]
                return _wait(limit, rows, tokens, now, blocked)
            cur.execute(
                self.q["insert_rate_grant"],
                {"name": name, "now": now, "tokens": tokens, "run_id": run_id.hex},
            )
            return RateAnswer(grant_id=int(cur.fetchone()[0]), wait_s=0.0)

    def correct_rate_grant(self: _SQLite, grant_id: int, tokens: int) -> None:
        with self._write() as (cur, _):
            cur.execute(self.q["correct_rate_grant"], {"id": grant_id, "tokens": tokens})

    def block_rate_limit(self: _SQLite, name: str, seconds: float) -> None:
        with self._write() as (cur, now):
            cur.execute(
                self.q["block_rate_limit"], {"name": name, "now": now, "ms": round(seconds * 1000)}
            )


class _Postgres(Protocol):
    q: Any

    def _connection(self) -> AbstractContextManager[Any]: ...


class PostgresRateLimits:
    def define_rate_limits(self: _Postgres, limits: Iterable[RateLimit], *, by: str) -> None:
        """See `SQLiteRateLimits.define_rate_limits`."""
        with self._connection() as conn, conn.transaction():
            for limit in limits:
                conn.execute(self.q["define_rate_limit"], _definition(limit, by))

    def rate_limit_rows(self: _Postgres) -> list[RateLimitRow]:
        with self._connection() as conn:
            return [
                RateLimitRow(
                    limit=_limit(r),
                    used_requests=int(r["used_requests"]),
                    used_tokens=int(r["used_tokens"]),
                    blocked_until=r["blocked_until"],
                    updated_by=r["updated_by"],
                )
                for r in conn.execute(self.q["select_rate_limits"])
            ]

    def acquire_rate(self: _Postgres, name: str, tokens: int, run_id: UUID) -> RateAnswer:
        """See `SQLiteRateLimits.acquire_rate`; the limit's row lock orders the acquirers."""
        with self._connection() as conn, conn.transaction():
            found = conn.execute(self.q["lock_rate_limit"], {"name": name}).fetchone()
            if found is None:
                raise UnknownRateLimit(f"the store keeps no rate limit {name!r}")
            limit = _limit(found)
            blocked = found["blocked_until"]
            use = conn.execute(
                self.q["acquire_rate_grant"],
                {
                    "name": name,
                    "window_us": limit.window_us,
                    "tokens": tokens,
                    "run_id": run_id,
                    "blocked": blocked,
                    "requests": limit.requests,
                    "limit_tokens": limit.tokens,
                },
            ).fetchone()
            if use["grant_id"] is not None:
                return RateAnswer(grant_id=int(use["grant_id"]), wait_s=0.0)
            clock: datetime = use["now"]
            window = {"name": name, "now": clock, "window_us": limit.window_us}
            cells = conn.execute(self.q["window_rate_grants"], window).fetchall()
            rows = [(_us(r["granted_at"]), int(r["tokens"])) for r in cells]
            blocked_us = None if blocked is None else _us(blocked)
            return _wait(limit, rows, tokens, _us(clock), blocked_us)

    def correct_rate_grant(self: _Postgres, grant_id: int, tokens: int) -> None:
        with self._connection() as conn:
            conn.execute(self.q["correct_rate_grant"], {"id": grant_id, "tokens": tokens})

    def block_rate_limit(self: _Postgres, name: str, seconds: float) -> None:
        with self._connection() as conn:
            conn.execute(self.q["block_rate_limit"], {"name": name, "ms": round(seconds * 1000)})
