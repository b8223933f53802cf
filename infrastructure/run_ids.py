"""Finding runs by a part of their id (ADR 0074): a mixin of both stores.

The statement is the named query `run_ids_like` of each backend: ids that start with the
digits (a range of the primary key) or end with them (a scan), live runs first, then the
tombstones of purged ones, so that a short id of a purged run still says it was purged.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol
from uuid import UUID

from steptrail.domain.ids import dashed_suffix, prefix_bounds


class _SQLiteStore(Protocol):
    q: Any

    def _read(self) -> AbstractContextManager[Any]: ...


class _PostgresStore(Protocol):
    q: Any

    def _connection(self) -> AbstractContextManager[Any]: ...


class SQLiteRunIds:
    def run_ids_like(self: _SQLiteStore, digits: str, limit: int) -> list[UUID]:
        """Up to `limit` ids that start or end with the hex `digits`, live runs first."""
        lo, hi = prefix_bounds(digits)
        params = {"lo": lo.hex, "hi": hi.hex, "suffix": f"%{digits}", "limit": limit}
        with self._read() as cur:
            cur.execute(self.q["run_ids_like"], params)
            return [UUID(hex=row[0]) for row in cur.fetchall()]


class PostgresRunIds:
    def run_ids_like(self: _PostgresStore, digits: str, limit: int) -> list[UUID]:
        """Up to `limit` ids that start or end with the hex `digits`, live runs first."""
        lo, hi = prefix_bounds(digits)
        params = {"lo": lo, "hi": hi, "suffix": f"%{dashed_suffix(digits)}", "limit": limit}
        with self._connection() as conn:
            return [row["run_id"] for row in conn.execute(self.q["run_ids_like"], params)]
