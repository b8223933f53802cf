"""The SQL handle user projections write through (`projections.custom.Sql`), per backend.

User SQL names its parameters `:name` on both backends. SQLite takes that as it is; for
psycopg the text is rewritten once (and cached): `:name` becomes `%(name)s`, a literal `%`
becomes `%%`, and quoted text and PostgreSQL's `::type` casts are left alone. Rows come back
as plain dicts on both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # each driver is imported where its backend is used, never the other's
    import sqlite3

    import psycopg
    from psycopg.rows import DictRow


@lru_cache(maxsize=512)
def to_psycopg(sql: str) -> str:
    """`sql` with `:name` parameters rewritten in psycopg's `%(name)s` style."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in ("'", '"'):
            end = sql.find(c, i + 1)
            end = n - 1 if end == -1 else end
            out.append(sql[i : end + 1].replace("%", "%%"))
            i = end + 1
        elif c == ":" and i + 1 < n and sql[i + 1] == ":":
            out.append("::")
            i += 2
        elif c == ":" and i + 1 < n and (sql[i + 1].isalpha() or sql[i + 1] == "_"):
            j = i + 1
            while j < n and (sql[j].isalnum() or sql[j] == "_"):
                j += 1
            out.append(f"%({sql[i + 1 : j]})s")
            i = j
        elif c == "%":
            out.append("%%")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


class SqliteSql:
    """`Sql` on an SQLite cursor."""

    backend = "sqlite"

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self.cur = cur

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self.cur.execute(sql, dict(params or {}))

    def executemany(self, sql: str, params: Sequence[Mapping[str, Any]]) -> None:
        if params:
            self.cur.executemany(sql, [dict(p) for p in params])

    def fetchall(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        return [dict(r) for r in self.cur.execute(sql, dict(params or {})).fetchall()]

    def fetchone(self, sql: str, params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        row = self.cur.execute(sql, dict(params or {})).fetchone()
        return dict(row) if row is not None else None


class PostgresSql:
    """`Sql` on a psycopg connection (dict rows)."""

    backend = "postgres"

    def __init__(self, conn: psycopg.Connection[DictRow]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self.conn.execute(to_psycopg(sql).encode("utf-8"), params or {})

    def executemany(self, sql: str, params: Sequence[Mapping[str, Any]]) -> None:
        if params:
            with self.conn.cursor() as cur:
                cur.executemany(to_psycopg(sql).encode("utf-8"), params)

    def fetchall(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute(to_psycopg(sql).encode("utf-8"), params or {})]

    def fetchone(self, sql: str, params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        row = self.conn.execute(to_psycopg(sql).encode("utf-8"), params or {}).fetchone()
        return dict(row) if row is not None else None


# -- what steptrail itself does to a projection's tables (rebuild, verify) --------------------


def _sqlite_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sqlite_rows_of(cur: sqlite3.Cursor, table: str) -> list[tuple[Any, ...]]:
    """Every row of `table`, as tuples (for comparing a live table with its scratch copy)."""
    return [tuple(r) for r in cur.execute(f"SELECT * FROM {_sqlite_ident(table)}").fetchall()]


def sqlite_drop(cur: sqlite3.Cursor, table: str) -> None:
    cur.execute(f"DROP TABLE IF EXISTS {_sqlite_ident(table)}")


def postgres_rows_of(conn: psycopg.Connection[DictRow], table: str) -> list[tuple[Any, ...]]:
    from psycopg import sql as pgsql

    query = pgsql.SQL("SELECT * FROM {}").format(pgsql.Identifier(table))
    return [tuple(r.values()) for r in conn.execute(query)]


def postgres_drop(conn: psycopg.Connection[DictRow], table: str) -> None:
    from psycopg import sql as pgsql

    conn.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(table)))
