"""The testing kit's faults and replay check on `async def` agents (ADR 0074): the same
booking agent as tests/integration/test_testing_kit.py, written async, under the same
faults, must end the same way; a changed async agent is flagged by the replay check."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from steptrail import App
from steptrail.domain.enums import Effect, FailureClass, Outcome, RunStatus, TerminationReason
from steptrail.domain.run import Run
from steptrail.testing import Kit, crash_at, fail_at, lose_lease_at, replay_check
from steptrail.workers.async_context import AsyncRunContext

CALLS: Counter[str] = Counter()


def async_booking_app(*, nights_step: str = "nights") -> App:
    """Look up a price (awaited), ask approval to book, book (a write, awaited)."""
    app = App()
    app.tool("price", effect=Effect.READ_ONLY)
    app.tool("book", effect=Effect.NON_IDEMPOTENT_WRITE)

    async def count(name: str, value: Any) -> Any:
        await asyncio.sleep(0)
        CALLS[name] += 1
        return value

    @app.agent("booking")
    async def booking(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        nights = await ctx.step("think", nights_step, lambda: count("nights", 2))
        price = await ctx.tool(
            "price", lambda: count("price", 100 * nights), arguments={"n": nights}
        )
        decision = await ctx.request_approval(
            [{"name": "book", "arguments": {"city": request["city"], "price": price}}]
        )

        async def book(city: str, **_: Any) -> str:
            return str(await count("book", f"booked {city}"))

        results = await ctx.run_pending({"book": book})
        return {"approved": decision.approved, "results": [r.value or r.error for r in results]}

    return app


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    CALLS.clear()


@pytest.fixture
def steptrail_database_url(db_url: str) -> str:
    return db_url


@pytest.fixture
def steptrail_settings(backend: str) -> dict[str, Any]:
    if backend == "postgres":
        return {"lease_seconds": 1.0, "retry_base_seconds": 0.05, "poll_interval": 0.05}
    return {"poll_interval": 0.05}


@pytest.fixture
def steptrail_app() -> App:
    return async_booking_app()


def test_async_crash_at__recovers_and_replays_as_a_sync_agent_does(steptrail_kit: Kit) -> None:
    """A crash after the awaited price step (before its record): the reaper reclaims the
    run, the next segment replays step 1 and runs the price again, the booking happens once."""
    result = steptrail_kit.run_to_end(
        "booking", {"city": "Oslo"}, decide="approve", faults=[crash_at(2)]
    )
    assert result.crashes == 1
    assert result.status is RunStatus.COMPLETED
    assert CALLS == {"nights": 1, "price": 2, "book": 1}
    assert any(isinstance(e, Run.Reclaimed) for e in result.events)
    assert any(isinstance(e, Run.Replayed) for e in result.events)


def test_async_crash_at__unrecorded_write_dead_letters(steptrail_kit: Kit) -> None:
    result = steptrail_kit.run_to_end(
        "booking", {"city": "Oslo"}, decide="approve", faults=[crash_at(4)]
    )
    assert result.crashes == 1
    assert CALLS["book"] == 1
    assert result.status is RunStatus.FAILED
    reason = result.row.state.reason
    assert isinstance(reason, TerminationReason)
    assert reason.is_dead_letter


def test_async_lose_lease_at__zombie_stops_and_the_run_completes(steptrail_kit: Kit) -> None:
    result = steptrail_kit.run_to_end(
        "booking", {"city": "Oslo"}, decide="approve", faults=[lose_lease_at(2)]
    )
    assert Outcome.LEASE_LOST in [s.outcome for s in result.segments]
    assert result.status is RunStatus.COMPLETED
    assert CALLS["book"] == 1


def test_async_fail_at__classes_take_the_ladder_as_for_sync_agents(steptrail_kit: Kit) -> None:
    failed = steptrail_kit.run_to_end(
        "booking", {"city": "Oslo"}, faults=[fail_at(1, "client_error")]
    )
    assert failed.status is RunStatus.FAILED
    assert failed.row.state.failure_class is FailureClass.CLIENT_ERROR
    assert CALLS["nights"] == 0
    assert failed.steps[0].error_type == "InjectedFailure"
    retried = steptrail_kit.run_to_end(
        "booking", {"city": "Bergen"}, decide="approve", faults=[fail_at(2, "server_error")]
    )
    assert retried.status is RunStatus.COMPLETED
    assert CALLS == {"nights": 1, "price": 1, "book": 1}


def test_async_replay_check__flags_a_changed_async_agent(steptrail_kit: Kit) -> None:
    waiting = steptrail_kit.run_to_end("booking", {"city": "Oslo"})
    assert waiting.status is RunStatus.WAITING_FOR_APPROVAL
    CALLS.clear()
    same = replay_check(steptrail_kit.runtime, async_booking_app())
    assert [(v.run_id, v.verdict) for v in same] == [(str(waiting.run_id), "ok")]
    changed = replay_check(steptrail_kit.runtime, async_booking_app(nights_step="stay-length"))
    assert [v.verdict for v in changed] == ["non_deterministic"]
    assert changed[0].position == 1
    assert "'stay-length'" in (changed[0].found or "")
    assert CALLS == {}  # nothing executed
