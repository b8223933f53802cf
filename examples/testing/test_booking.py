# test_booking.py: an agent with a write tool and an approval
import pytest

import steptrail
from steptrail.testing import crash_at, replay_check

app = steptrail.App()
app.tool("price", effect="read_only")
app.tool("book", effect="non_idempotent_write")
booked = []


@app.agent("booking")
def booking(ctx: steptrail.RunContext, request: dict) -> dict:
    price = ctx.tool("price", lambda: 120 * request["nights"], arguments=request)
    decision = ctx.request_approval(
        [{"name": "book", "arguments": {"city": request["city"], "price": price}}]
    )
    results = ctx.run_pending({"book": lambda city, price: booked.append(city) or "ok"})
    return {"approved": decision.approved, "results": [r.value or r.error for r in results]}


@pytest.fixture
def steptrail_app():
    booked.clear()
    return app


def test_approved_booking_is_made_once(steptrail_kit):
    result = steptrail_kit.run_to_end("booking", {"city": "Oslo", "nights": 2}, decide="approve")
    assert result.status is steptrail.RunStatus.COMPLETED
    assert result.result == {"approved": True, "results": ["ok"]}
    assert booked == ["Oslo"]


def test_denied_booking_is_not_made(steptrail_kit):
    result = steptrail_kit.run_to_end("booking", {"city": "Oslo", "nights": 2}, decide="deny")
    assert result.result == {"approved": False, "results": ["denied by the operator"]}
    assert booked == []


def test_a_crash_after_pricing_still_books_once(steptrail_kit):
    # The process dies after step 1 ran, before its record was stored (like SIGKILL);
    # the kit lets the lease expire, the reaper reclaims the run, a new segment finishes it.
    result = steptrail_kit.run_to_end(
        "booking", {"city": "Oslo", "nights": 2}, decide="approve", faults=[crash_at(1)]
    )
    assert result.crashes == 1
    assert result.status is steptrail.RunStatus.COMPLETED
    assert booked == ["Oslo"]


def test_waiting_runs_replay_against_this_code(steptrail_kit):
    waiting = steptrail_kit.run_to_end("booking", {"city": "Oslo", "nights": 2})
    assert waiting.status is steptrail.RunStatus.WAITING_FOR_APPROVAL
    [verdict] = replay_check(steptrail_kit.runtime)
    assert verdict.verdict == "ok"
