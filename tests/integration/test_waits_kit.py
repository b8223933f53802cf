"""The testing kit drives waits (ADR 0073): timers and deadlines are skipped (SQLite) or
waited out (PostgreSQL), signals are delivered with `kit.signal`, on both backends."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from steptrail import App, RunContext, WaitTimedOut
from steptrail.domain.enums import RunStatus
from steptrail.testing import Kit, crash_at, lose_lease_at

CALLS: Counter[str] = Counter()


def waits_app() -> App:
    app = App()

    @app.agent("digest")
    def digest(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("look", lambda: CALLS.update(["look"]) or "seen")
        ctx.sleep(request["hours"] * 3600)
        ctx.llm("look again", lambda: CALLS.update(["again"]) or "seen again")
        return {"done": True}

    @app.agent("booking")
    def booking(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        try:
            paid = ctx.wait_event("payment", timeout=request.get("timeout"))
        except WaitTimedOut:
            return {"booked": False}
        return {"booked": True, "amount": paid["amount"]}

    return app


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    CALLS.clear()


@pytest.fixture
def steptrail_database_url(db_url: str) -> str:
    return db_url


@pytest.fixture
def steptrail_settings() -> dict[str, Any]:
    return {"lease_seconds": 2.0, "poll_interval": 0.05}


@pytest.fixture
def steptrail_app() -> App:
    return waits_app()


def test_kit__skips_a_long_sleep(steptrail_kit: Kit) -> None:
    """A day-long sleep ends at once on SQLite (the store's clock is skipped); each step
    before it ran once."""
    if not steptrail_kit.can_skip_time:
        # The server's clock cannot be skipped here: the run sleeps, due a day later.
        run_id = steptrail_kit.enqueue("digest", {"hours": 24})
        waiting = steptrail_kit.drive(run_id, stop_after=1)
        assert waiting.status is RunStatus.WAITING_FOR_TIMER
        assert waiting.row.available_at is not None
        due = (waiting.row.available_at - steptrail_kit.now()).total_seconds()
        assert 24 * 3600 - 60 < due <= 24 * 3600
        return
    result = steptrail_kit.run_to_end("digest", {"hours": 24})
    assert result.status is RunStatus.COMPLETED
    assert Counter({"look": 1, "again": 1}) == CALLS
    assert [s.kind for s in result.steps] == ["llm", "sleep", "llm"]


def test_kit__short_sleep_on_any_backend(steptrail_kit: Kit) -> None:
    """A short sleep is waited out where time cannot be skipped."""
    result = steptrail_kit.run_to_end("digest", {"hours": 0.3 / 3600})
    assert result.status is RunStatus.COMPLETED


def test_kit__signal_then_drive(steptrail_kit: Kit) -> None:
    """Without a deadline the drive stops at the wait; kit.signal delivers, drive ends it."""
    first = steptrail_kit.run_to_end("booking", {})
    assert first.status is RunStatus.WAITING_FOR_EVENT
    assert steptrail_kit.signal(first.run_id, "payment", {"amount": 42}) == 1
    done = steptrail_kit.drive(first.run_id)
    assert done.status is RunStatus.COMPLETED
    assert done.result == {"booked": True, "amount": 42}


def test_kit__a_wait_deadline_fires(steptrail_kit: Kit) -> None:
    """A wait's timeout is a deadline the kit skips to (or waits out): the fallback runs."""
    result = steptrail_kit.run_to_end("booking", {"timeout": 0.3})
    assert result.status is RunStatus.COMPLETED
    assert result.result == {"booked": False}


def test_kit__a_crash_after_the_woken_step_does_not_sleep_again(steptrail_kit: Kit) -> None:
    """The woken segment keeps the sleep's outcome pending past the next step's boundary
    (ADR 0085); dying after that step ran, before anything was appended, loses the outcome
    with the step. The next segment records the outcome again from the run's state (it was
    woken from that sleep): it does not sleep a second time, and only the lost step runs
    again."""
    result = steptrail_kit.run_to_end("digest", {"hours": 0.3 / 3600}, faults=[crash_at(3)])
    assert result.status is RunStatus.COMPLETED
    assert Counter({"look": 1, "again": 2}) == CALLS
    assert [s.kind for s in result.steps] == ["llm", "sleep", "llm"]
    trail = [type(h.event).__name__ for h in steptrail_kit.runtime.history(result.run_id)]
    assert trail.count("WaitStarted") == 1


def test_kit__a_zombie_after_the_wake_leaves_one_outcome(steptrail_kit: Kit) -> None:
    """A woken segment that loses its run at the step after the sleep appends nothing (its
    pending outcome goes with it); the segment that takes over records the outcome once."""
    result = steptrail_kit.run_to_end("digest", {"hours": 0.3 / 3600}, faults=[lose_lease_at(3)])
    assert result.status is RunStatus.COMPLETED
    assert [s.kind for s in result.steps] == ["llm", "sleep", "llm"]
    trail = [type(h.event).__name__ for h in steptrail_kit.runtime.history(result.run_id)]
    assert trail.count("WaitStarted") == 1
