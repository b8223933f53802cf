"""The PostgreSQL store as the reporting views' Dialect (reporting_store): named queries on
one transaction, a scratch schema to rebuild a projection into, and the value conversions."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from steptrail.domain.errors import StoreUnavailable
from steptrail.infrastructure.pg_connections import (
    _CONNECTION_ERRORS,
    PostgresStoreBase,
    _first_line,
)
from steptrail.infrastructure.sqlfiles import statements
from steptrail.infrastructure.user_sql import PostgresSql, postgres_drop, postgres_rows_of


class PostgresReporting(PostgresStoreBase):
    """The reporting Dialect of `PostgresRunStore` (see the module docstring)."""

    @contextmanager
    def reporting_write(self) -> Iterator[_PgTx]:
        with self._connection() as conn, conn.transaction():
            yield _PgTx(conn, self.q)

    @contextmanager
    def reporting_read(self) -> Iterator[_PgTx]:
        with self._connection() as conn:
            yield _PgTx(conn, self.q)

    @contextmanager
    def reporting_snapshot(self) -> Iterator[_PgTx]:
        """A REPEATABLE READ, READ ONLY transaction: one snapshot for all its statements."""
        with self._connection() as conn, conn.transaction():
            conn.execute(self.q["snapshot_for_verify"])
            yield _PgTx(conn, self.q)

    @contextmanager
    def scratch(self) -> Iterator[Callable[[], AbstractContextManager[_PgTx]]]:
        """A private schema to rebuild a projection into (`verify`), on a connection of its
        own whose search path holds only that schema, so the projection's unqualified table
        names resolve to the scratch copies; yields a function that opens a transaction on
        it. Each transaction is short (a batch): a long one would hold every reader of the
        log back (ADR 0012). The schema is dropped at the end."""
        schema = f"steptrail_scratch_{uuid4().hex[:12]}"
        try:
            conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
        except _CONNECTION_ERRORS as e:
            raise StoreUnavailable(_first_line(e)) from e
        try:
            conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(schema)))
            conn.execute(pgsql.SQL("SET search_path TO {}").format(pgsql.Identifier(schema)))

            @contextmanager
            def transaction() -> Iterator[_PgTx]:
                with conn.transaction():
                    yield _PgTx(conn, self.q)

            yield transaction
        finally:
            with suppress(psycopg.Error):
                conn.execute(
                    pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema))
                )
            conn.close()

    @staticmethod
    def db_id(value: UUID) -> Any:
        return value

    @staticmethod
    def db_ids(values: Sequence[UUID]) -> Any:
        return list(values)

    @staticmethod
    def db_time(value: datetime | None) -> Any:
        return value

    @staticmethod
    def py_time(value: Any) -> datetime | None:
        return value  # type: ignore[no-any-return]

    @staticmethod
    def db_json(value: Any) -> Any:
        return Jsonb(value)

    @staticmethod
    def db_now() -> Any:
        return None  # PostgreSQL reads now() inside the query


class _PgTx:
    """Named queries on one connection (inside a transaction when writing)."""

    def __init__(self, conn: psycopg.Connection[DictRow], q: dict[str, str]) -> None:
        self.conn = conn
        self.q = q

    def all(self, name: str, params: Mapping[str, Any]) -> list[Any]:
        return self.conn.execute(self.q[name], params).fetchall()

    def run(self, name: str, params: Mapping[str, Any]) -> None:
        for statement in statements(self.q[name]):
            self.conn.execute(statement.encode("utf-8"), params)

    def many(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        if params:
            with self.conn.cursor() as cur:
                cur.executemany(self.q[name], params)

    def sql(self) -> PostgresSql:
        """The handle a user projection writes through, on this transaction."""
        return PostgresSql(self.conn)

    def rows_of(self, table: str) -> list[tuple[Any, ...]]:
        return postgres_rows_of(self.conn, table)

    def drop(self, table: str) -> None:
        postgres_drop(self.conn, table)
