"""The SQLite store as the reporting views' Dialect (reporting_store): named queries on one
transaction, a scratch database to rebuild a projection into, and the value conversions."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

from steptrail.infrastructure.sqlfiles import statements
from steptrail.infrastructure.sqlite_connections import (
    SQLiteStoreBase,
    to_datetime,
    to_us,
)
from steptrail.infrastructure.user_sql import SqliteSql, sqlite_drop, sqlite_rows_of


class SQLiteReporting(SQLiteStoreBase):
    """The reporting Dialect of `SQLiteRunStore` (see the module docstring)."""

    @contextmanager
    def reporting_write(self) -> Iterator[_SqliteTx]:
        with self._write() as (cur, _):
            yield _SqliteTx(cur, self.q)

    @contextmanager
    def reporting_read(self) -> Iterator[_SqliteTx]:
        with self._read() as cur:
            yield _SqliteTx(cur, self.q)

    @contextmanager
    def reporting_snapshot(self) -> Iterator[_SqliteTx]:
        """A read transaction: one WAL snapshot for all its statements."""
        with self._read() as cur:
            cur.execute("BEGIN")
            try:
                yield _SqliteTx(cur, self.q)
            finally:
                cur.execute("COMMIT")

    @contextmanager
    def scratch(self) -> Iterator[Callable[[], AbstractContextManager[_SqliteTx]]]:
        """A private in-memory database to rebuild a projection into (`verify`); yields a
        function that opens a transaction on it. Nothing of it outlives the block."""
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row

        @contextmanager
        def transaction() -> Iterator[_SqliteTx]:
            cur = conn.cursor()
            cur.execute("BEGIN")
            try:
                yield _SqliteTx(cur, self.q)
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

        try:
            yield transaction
        finally:
            conn.close()

    @staticmethod
    def db_id(value: UUID) -> Any:
        return value.hex

    @staticmethod
    def db_ids(values: Sequence[UUID]) -> Any:
        return json.dumps([v.hex for v in values])

    @staticmethod
    def db_time(value: datetime | None) -> Any:
        return to_us(value)

    @staticmethod
    def py_time(value: Any) -> datetime | None:
        return to_datetime(value)

    @staticmethod
    def db_json(value: Any) -> Any:
        return json.dumps(value, separators=(",", ":"))

    def db_now(self) -> Any:
        return self.now_us()


class _SqliteTx:
    """Named queries on one cursor (inside an IMMEDIATE transaction when writing)."""

    def __init__(self, cur: sqlite3.Cursor, q: dict[str, str]) -> None:
        self.cur = cur
        self.q = q

    def all(self, name: str, params: Mapping[str, Any]) -> list[Any]:
        return self.cur.execute(self.q[name], dict(params)).fetchall()

    def run(self, name: str, params: Mapping[str, Any]) -> None:
        for statement in statements(self.q[name]):
            self.cur.execute(statement, dict(params))

    def many(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        if params:
            self.cur.executemany(self.q[name], [dict(p) for p in params])

    def sql(self) -> SqliteSql:
        """The handle a user projection writes through, on this transaction."""
        return SqliteSql(self.cur)

    def rows_of(self, table: str) -> list[tuple[Any, ...]]:
        return sqlite_rows_of(self.cur, table)

    def drop(self, table: str) -> None:
        sqlite_drop(self.cur, table)
