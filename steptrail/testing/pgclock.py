"""Time skipping on PostgreSQL, for test databases only (ADR 0034).

steptrail's SQL reads the server's clock as `now()`, `clock_timestamp()` and
`statement_timestamp()`, unqualified. In a database the testing kit creates, a schema
`steptrail_testing_clock` holds functions of those names that add a skipped offset (one
row of one table), and the database's default `search_path` lists that schema before
`pg_catalog`, so every connection's unqualified `now()` is the skipped clock. No statement
of the store changes, and production databases never have the schema. `skip()` adds to the
offset; every connection sees it at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

SCHEMA = "steptrail_testing_clock"
INSTALL = f"""
CREATE SCHEMA {SCHEMA};
CREATE TABLE {SCHEMA}.skipped (us bigint NOT NULL);
INSERT INTO {SCHEMA}.skipped VALUES (0);
CREATE FUNCTION {SCHEMA}.now() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.now() + (SELECT us FROM {SCHEMA}.skipped) * interval '1 microsecond'
$$;
CREATE FUNCTION {SCHEMA}.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
    SELECT pg_catalog.clock_timestamp()
        + (SELECT us FROM {SCHEMA}.skipped) * interval '1 microsecond'
$$;
CREATE FUNCTION {SCHEMA}.statement_timestamp() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.statement_timestamp()
        + (SELECT us FROM {SCHEMA}.skipped) * interval '1 microsecond'
$$;
"""


def url_of(server: str, database: str) -> str:
    base, _, _ = server.rpartition("/")
    return f"{base}/{database}"


@contextmanager
def fresh_database(server: str, *, prefix: str = "steptrail_kit") -> Iterator[str]:
    """A new database on the PostgreSQL `server` (a URL of any database there) with the
    skippable clock installed; yields its URL and drops it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = url_of(server, name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(INSTALL.encode())
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET search_path = public, {}, pg_catalog").format(
                    sql.Identifier(name), sql.Identifier(SCHEMA)
                )
            )
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def installed(url: str) -> bool:
    """Whether connections to `url` read the skippable clock."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT to_regprocedure(%s) IS NOT NULL AND %s = ANY(current_schemas(false))",
            (f"{SCHEMA}.now()", SCHEMA),
        ).fetchone()
    return bool(row and row[0])


def skip(url: str, seconds: float) -> None:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            sql.SQL("UPDATE {}.skipped SET us = us + %s").format(sql.Identifier(SCHEMA)),
            (round(seconds * 1_000_000),),
        )
