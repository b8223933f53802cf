"""Time skipping through the plugin's own databases: a fresh SQLite file, or a fresh
PostgreSQL database with the kit's clock, per test; the production retry ladder
(30 s · 2^n) and lease; no sleeping."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from steptrail import App
from steptrail.domain.enums import RunStatus
from steptrail.domain.run import Run
from steptrail.testing import Kit
from steptrail.testing.pgclock import fresh_database
from tests.conftest import PG_ADMIN_URL
from tests.integration.test_testing_kit import CALLS, booking_app, ladder_app


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    CALLS.clear()


@pytest.fixture(params=["sqlite", "postgres"])
def steptrail_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """What the plugin gives a test: SQLite by default, PostgreSQL when pointed at a server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'steptrail.db'}"
        return
    request.getfixturevalue("pg_database")  # PostgreSQL must be reachable (fails under CI)
    with fresh_database(PG_ADMIN_URL) as url:
        yield url


@pytest.fixture
def steptrail_app() -> App:
    app = booking_app()
    app.include(ladder_app())
    return app


def test_skip__three_retry_ladder_at_30s_takes_under_a_second(steptrail_kit: Kit) -> None:
    """Three requeues 30 s, 60 s, 120 s apart finish in under a second of wall time."""
    started = time.monotonic()
    result = steptrail_kit.run_to_end("flaky")
    elapsed = time.monotonic() - started
    assert result.status is RunStatus.COMPLETED
    assert result.result == "answer"
    requeued = [e for e in result.events if isinstance(e, Run.Requeued)]
    assert [r.delay_ms for r in requeued] == [30_000, 60_000, 120_000]
    assert elapsed < 1.0, f"took {elapsed:.2f} s"


def test_skip__reaper_sees_the_skipped_time(steptrail_kit: Kit) -> None:
    """A crashed run's lease expires for the reaper only once the clock moved past it."""
    rt = steptrail_kit.runtime
    run_id = steptrail_kit.enqueue("booking", {"city": "Oslo"})
    claimed = rt.store.claim_batch(
        holder="dead", lease_ms=rt.settings.lease_ms, agents=["booking"], limit=1
    )
    assert [c.run.id for c in claimed] == [run_id]
    assert steptrail_kit.reap().requeued == 0
    steptrail_kit.skip(rt.settings.lease_seconds + 1)
    assert steptrail_kit.reap().requeued == 1


def test_skip__purge_sees_the_retention_window_pass(steptrail_kit: Kit) -> None:
    """A finished run outlives a one-day retention window only until a day is skipped."""
    done = steptrail_kit.run_to_end("flaky")
    assert done.status is RunStatus.COMPLETED
    assert steptrail_kit.purge(days=1).total == 0
    steptrail_kit.skip(86_400 + 60)
    assert steptrail_kit.purge(days=1).total == 1
