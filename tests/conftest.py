"""Fixtures shared by every test folder.

`backend` parametrises a test over SQLite and PostgreSQL. PostgreSQL gets one database per
test session (created here, migrated once, dropped at the end) and every test starts from
empty tables. When PostgreSQL cannot be reached its tests fail under `CI=true` and are
skipped, loudly, otherwise.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql
import pytest

from steptrail.infrastructure.factory import open_store
from steptrail.infrastructure.logging import configure_logging
from steptrail.infrastructure.postgres import PostgresRunStore
from steptrail.infrastructure.settings import Settings
from steptrail.infrastructure.sqlite import SQLiteRunStore
from steptrail.runtime import Runtime, open_runtime

PG_ADMIN_URL = os.environ.get(
    "STEPTRAIL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TABLES = ("steptrail_events", "steptrail_runs", "steptrail_saved")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _url_for(database: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{database}"


@pytest.fixture(scope="session", autouse=True)
def quiet_logs() -> None:
    """Warnings and errors only: the suites log thousands of run events otherwise."""
    configure_logging("console", "warning")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """The URL of this session's PostgreSQL database, migrated."""
    name = f"steptrail_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        if IN_CI:
            pytest.fail(f"PostgreSQL is required under CI=true and is unreachable: {error}")
        pytest.skip(f"PostgreSQL unreachable (run ./scripts/ensure-postgres): {error}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _url_for(name)
    open_store(url).close()
    yield url
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """The session database, emptied for this test."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        extra = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename LIKE 'steptrail_%' AND tablename <> 'steptrail_schema_migrations'"
            )
        ]
        conn.execute(f"TRUNCATE {', '.join(sorted(set(TABLES) | set(extra)))} RESTART IDENTITY")
        # Tables of user projections (tests' own apps) start from nothing too.
        for (table,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename NOT LIKE 'steptrail_%'"
        ).fetchall():
            conn.execute(
                psycopg.sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(table)
                )
            )
    return pg_database


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'steptrail.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A database URL of the parametrised backend, empty."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(request.getfixturevalue("sqlite_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[PostgresRunStore | SQLiteRunStore]:
    s = open_store(db_url)
    yield s
    s.close()


FAST = {
    "lease_seconds": 2.0,
    "retry_base_seconds": 0.05,
    "retry_cap_seconds": 0.2,
    "poll_interval": 0.05,
    "log_level": "warning",
}


def make_runtime(url: str, app: Any = None, **overrides: Any) -> Runtime:
    settings = Settings(**{**FAST, **overrides, "database_url": url})
    return open_runtime(app, settings=settings)


@pytest.fixture
def runtime(db_url: str) -> Iterator[Runtime]:
    """A runtime on the parametrised backend with short leases and retry delays."""
    rt = make_runtime(db_url)
    yield rt
    rt.close()


def logged_events(rt: Runtime) -> int:
    """Every event in the log, read run by run: unlike the feed (`rt.events`), which stops
    below the oldest transaction still open anywhere on the server (ADR 0047), this sees
    each commit at once, so "nothing written" checks hold while other databases are busy."""
    return sum(len(rt.history(run.run_id)) for run in rt.runs(limit=100_000))
