"""Rate limits under the testing kit (ADR 0080): a wait for a window a minute away is a
durable sleep the kit skips, as it skips any timer, on both backends (the kit's own
databases: SQLite's skipped clock, PostgreSQL's `steptrail_testing_clock`)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from steptrail import App, RunContext
from steptrail.domain.enums import RunStatus
from steptrail.domain.waits import WaitStarted
from steptrail.testing import Kit

# The kit's own databases on both backends, as the time-skipping tests have them.
from tests.integration.test_testing_kit_time import steptrail_database_url  # noqa: F401


@pytest.fixture
def steptrail_app() -> App:
    app = App()
    app.rate_limit("per-minute", requests=1, per=60)

    @app.agent("ask")
    def ask(ctx: RunContext, request: dict[str, Any]) -> str:
        return ctx.llm("ask", lambda: "answer", limit="per-minute")

    return app


def test_kit__a_minute_long_wait_for_the_window_is_skipped(steptrail_kit: Kit) -> None:
    """The second run of a one-per-minute limit sleeps on `rate_limit:per-minute`; the kit
    skips the minute and it completes, in well under the minute."""
    started = time.monotonic()
    assert steptrail_kit.run_to_end("ask").status is RunStatus.COMPLETED
    second = steptrail_kit.run_to_end("ask")
    assert second.status is RunStatus.COMPLETED
    assert [e.name for e in second.events if isinstance(e, WaitStarted)] == [
        "rate_limit:per-minute"
    ]
    assert time.monotonic() - started < 30
