"""The pytest plugin steptrail installs (entry point `pytest11`): fixtures for testing agents.

Nothing happens at import time and nothing is configured globally: the fixtures below exist
in every pytest session, and only a test that asks for one gets a database.

* `steptrail_app`: your agents; override it in your conftest.py (default: none but the
  built-in `scripted` agent).
* `steptrail_settings`: settings overrides for the runtime (a dict; override to change).
* `steptrail_database_url`: a fresh database per test: SQLite in the test's tmp_path, or,
  with `--steptrail-database-url URL` / `STEPTRAIL_TEST_DATABASE_URL` pointing at a
  PostgreSQL server, a new database on it (with a clock the kit can skip), dropped after.
* `steptrail_runtime`: a `Runtime` on that database; `steptrail_kit`: a `Kit` driving it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from steptrail.runtime import Runtime
    from steptrail.testing.kit import Kit
    from steptrail.workers.registry import App

ENV_URL = "STEPTRAIL_TEST_DATABASE_URL"
DEFAULT_SETTINGS: dict[str, Any] = {
    "lease_seconds": 5.0,
    "poll_interval": 0.05,
    "log_level": "warning",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("steptrail", "steptrail testing kit")
    group.addoption(
        "--steptrail-database-url",
        metavar="URL",
        default=None,
        help="A PostgreSQL server (postgresql://user@host/db) on which each test that uses "
        f"steptrail_runtime gets a fresh database, dropped after. Default: ${ENV_URL}, "
        "else a fresh SQLite file per test.",
    )


@pytest.fixture
def steptrail_app() -> App | None:
    """Your agents (override in conftest.py); None: only the built-in `scripted` agent."""
    return None


@pytest.fixture
def steptrail_settings() -> dict[str, Any]:
    """Settings overrides for `steptrail_runtime` (override in conftest.py)."""
    return dict(DEFAULT_SETTINGS)


@pytest.fixture
def steptrail_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database for this test (see the module docstring)."""
    server = request.config.getoption("--steptrail-database-url") or os.environ.get(ENV_URL)
    if not server:
        yield f"sqlite:///{tmp_path / 'steptrail.db'}"
        return
    if not server.startswith(("postgresql://", "postgres://")):
        raise pytest.UsageError(f"--steptrail-database-url must be a PostgreSQL URL: {server}")
    from steptrail.testing.pgclock import fresh_database

    with fresh_database(server) as url:
        yield url


@pytest.fixture
def steptrail_runtime(
    steptrail_database_url: str,
    steptrail_app: App | None,
    steptrail_settings: dict[str, Any],
) -> Iterator[Runtime]:
    """A runtime with your agents on this test's fresh database, closed after the test."""
    from steptrail.infrastructure.settings import Settings
    from steptrail.runtime import open_runtime

    settings = Settings(**{**steptrail_settings, "database_url": steptrail_database_url})
    runtime = open_runtime(steptrail_app, settings=settings)
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def steptrail_kit(steptrail_runtime: Runtime) -> Kit:
    """A `Kit` on `steptrail_runtime`: run_to_end, skip, faults, replay checks."""
    from steptrail.testing.kit import Kit

    return Kit(steptrail_runtime)
