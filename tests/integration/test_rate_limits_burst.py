"""Burst mode and rate limits (ADR 0083): a burst does not end while runs of its queues
sleep on their rate limit and wake within the horizon, and does end when the only runs
left wake beyond it. On both backends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from steptrail import App, RunContext
from steptrail.domain import rate_limits as rate_limit_rules
from steptrail.domain.enums import RunStatus
from steptrail.domain.waits import WaitStarted
from steptrail.runtime import Runtime
from steptrail.workers import rate_limits
from tests.conftest import make_runtime

app = App()
app.rate_limit("hour", requests=1, per=3600)
app.rate_limit("brief", requests=1, per=0.6, margin=0)
app.queue("other")


@app.agent("asker")
def asker(ctx: RunContext, request: dict[str, Any]) -> Any:
    return ctx.llm("ask", lambda: "answer", limit=request.get("limit", "brief"))


@app.agent("napper")
def napper(ctx: RunContext, request: dict[str, Any]) -> Any:
    ctx.sleep(0.3)
    return "rested"


@pytest.fixture
def rt(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    monkeypatch.setattr(rate_limits, "PATIENCE_S", 0.0)  # every wait is a sleep
    runtime = make_runtime(db_url, app, privacy_level="full")
    yield runtime
    runtime.close()


def slept_on_limit(rt: Runtime, run_id: Any) -> bool:
    return any(
        isinstance(h.event, WaitStarted) and h.event.name.startswith("rate_limit:")
        for h in rt.history(run_id)
    )


def test_burst__drains_runs_asleep_on_their_rate_limit(rt: Runtime) -> None:
    """Three runs on 1 per 0.6 s: two of them sleep on the limit's timer, and one burst
    still completes all three."""
    runs = [rt.enqueue("asker") for _ in range(3)]
    rt.work(burst=True)
    assert [rt.get(r).status for r in runs] == [RunStatus.COMPLETED] * 3
    assert sum(slept_on_limit(rt, r) for r in runs) >= 1


def test_burst__ends_when_the_limit_wakes_its_runs_beyond_the_horizon(rt: Runtime) -> None:
    """1 per hour: the second run is told to wait the hour, beyond the horizon, so the
    burst ends with it asleep rather than hanging for the hour."""
    first = rt.enqueue("asker", {"limit": "hour"})
    second = rt.enqueue("asker", {"limit": "hour"})
    rt.work(burst=True)
    assert rt.get(first).status is RunStatus.COMPLETED
    row = rt.get(second)
    assert row.status is RunStatus.WAITING_FOR_TIMER
    assert row.state.waiting is not None
    assert row.state.waiting.name == "rate_limit:hour"


def test_held_back__rate_limit_sleepers_within_the_horizon_only(rt: Runtime) -> None:
    """`held_back` sees a run asleep on its rate limit when it wakes within the horizon,
    not beyond it, not for other agents or queues; a run asleep on its own timer is not
    held back."""
    rt.enqueue("asker")
    rt.enqueue("asker")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rate_limit_rules, "BURST_HORIZON_S", 0.0)
        rt.work(burst=True)  # the second run now sleeps on `rate_limit:brief`
    store, agents = rt.store, ["asker"]
    assert store.held_back(agents=agents, rate_horizon_s=60)
    assert store.held_back(agents=agents, queues=["default"], rate_horizon_s=60)
    assert not store.held_back(agents=agents, queues=["other"], rate_horizon_s=60)
    assert not store.held_back(agents=["napper"], rate_horizon_s=60)
    assert not store.held_back(agents=agents, rate_horizon_s=0)
    napping = rt.enqueue("napper")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rate_limit_rules, "BURST_HORIZON_S", 0.0)
        rt.work(burst=True)
    assert rt.get(napping).status is RunStatus.WAITING_FOR_TIMER
    assert not store.held_back(agents=["napper"], rate_horizon_s=60)
