"""Rate limits on tool steps (ADR 0083): `ctx.tool(..., limit=, tokens=)` takes a grant as
`ctx.llm` does, and a write tool's pending-effect marker comes only after it, on both
backends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from steptrail import App, RunContext
from steptrail.domain.enums import RunStatus
from steptrail.domain.rate_limits import UnknownRateLimit
from steptrail.domain.run import Run
from steptrail.domain.waits import WaitStarted
from steptrail.runtime import Runtime
from steptrail.workers import rate_limits
from steptrail.workers.async_context import AsyncRunContext
from steptrail.workers.context import Recorded
from tests.conftest import make_runtime
from tests.integration.test_waits import drain_until, result_of

app = App()
app.rate_limit("hour", requests=3, tokens=100, per=3600)
app.rate_limit("brief", requests=1, per=0.6, margin=0)
app.tool("search", effect="read_only")
app.tool("send", effect="non_idempotent_write")
SENT: list[Any] = []


@app.agent("searcher")
def searcher(ctx: RunContext, request: dict[str, Any]) -> Any:
    found = ctx.tool(
        "search",
        lambda: Recorded(["hit"], tokens=request.get("used", 0)),
        arguments={"q": "x"},
        limit=request.get("limit", "hour"),
        tokens=request.get("estimate"),
    )
    if request.get("sleep"):
        ctx.sleep(0.3)
    return found


@app.agent("sender")
def sender(ctx: RunContext, request: dict[str, Any]) -> Any:
    return ctx.tool("send", lambda: SENT.append(ctx.run_id) or "sent", limit="brief")


@app.agent("async_sender")
async def async_sender(ctx: AsyncRunContext, request: dict[str, Any]) -> Any:
    async def send() -> str:
        SENT.append(ctx.run_id)
        return "sent"

    return await ctx.tool("send", send, limit="brief")


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    SENT.clear()
    runtime = make_runtime(db_url, app, privacy_level="full")
    yield runtime
    runtime.close()


def used(rt: Runtime, name: str) -> tuple[int, int]:
    (row,) = [r for r in rt.store.rate_limit_rows() if r.limit.name == name]
    return row.used_requests, row.used_tokens


def names(rt: Runtime, run_id: Any) -> list[str]:
    return [type(h.event).__name__ for h in rt.history(run_id)]


def test_tool__acquires_once_corrects_and_replay_never_acquires(rt: Runtime) -> None:
    """A read tool with limit= takes one grant with its estimate, Recorded(tokens=) replaces
    it, and the replay after the run's sleep takes none."""
    run_id = rt.enqueue("searcher", {"estimate": 40, "used": 7, "sleep": True})
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_TIMER
    drain_until(rt, run_id, RunStatus.COMPLETED)
    assert result_of(rt, run_id) == {"result": ["hit"]}
    assert used(rt, "hour") == (1, 7)


def test_tool__a_write_waits_for_its_grant_before_its_marker(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no patience, the second run's write tool suspends on `rate_limit:brief` with no
    pending-effect marker in its log; woken, it is granted, marks, sends once and completes."""
    monkeypatch.setattr(rate_limits, "PATIENCE_S", 0.0)
    monkeypatch.setattr("steptrail.domain.rate_limits.BURST_HORIZON_S", 0.0)
    first, second = rt.enqueue("sender"), rt.enqueue("sender")
    rt.work(burst=True)
    assert rt.get(first).status is RunStatus.COMPLETED
    row = rt.get(second)
    assert row.status is RunStatus.WAITING_FOR_TIMER
    assert row.state.waiting is not None
    assert row.state.waiting.name == "rate_limit:brief"
    assert "EffectPending" not in names(rt, second)
    assert not row.state.pending_effects
    drain_until(rt, second, RunStatus.COMPLETED)
    events = names(rt, second)
    assert events.count("EffectPending") == 1
    assert events.index("WaitStarted") < events.index("EffectPending")
    assert "Failed" not in events
    assert [first, second] == SENT


def test_tool__a_write_waiting_in_place_marks_after_the_grant(rt: Runtime) -> None:
    """Two writes on one limit of 1 per 0.6 s in one burst: the second waits in place (no
    suspension); each run has one marker and one send."""
    runs = [rt.enqueue("sender"), rt.enqueue("sender")]
    rt.work(burst=True)
    for run_id in runs:
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert names(rt, run_id).count("EffectPending") == 1
        assert not [h for h in rt.history(run_id) if isinstance(h.event, WaitStarted)]
    assert sorted(map(str, SENT)) == sorted(map(str, runs))


def test_async_tool__a_write_suspends_and_wakes(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async write tool whose grant must wait suspends with no marker and completes once
    woken, sending once per run."""
    monkeypatch.setattr(rate_limits, "PATIENCE_S", 0.0)
    monkeypatch.setattr("steptrail.domain.rate_limits.BURST_HORIZON_S", 0.0)
    first, second = rt.enqueue("async_sender"), rt.enqueue("async_sender")
    rt.work(burst=True)
    waiting = [r for r in (first, second) if rt.get(r).status is RunStatus.WAITING_FOR_TIMER]
    assert len(waiting) == 1
    assert "EffectPending" not in names(rt, waiting[0])
    drain_until(rt, waiting[0], RunStatus.COMPLETED)
    assert rt.get(first).status is rt.get(second).status is RunStatus.COMPLETED
    assert sorted(map(str, SENT)) == sorted(map(str, (first, second)))


def test_tool__bad_use_is_refused_with_nothing_written(rt: Runtime) -> None:
    """An unknown limit or an estimate over the limit's tokens fails the run before the
    tool: no grant, no marker, no step recorded."""
    bad = [rt.enqueue("searcher", {"limit": "nope"}), rt.enqueue("searcher", {"estimate": 101})]
    rt.work(burst=True)
    for run_id in bad:
        assert rt.get(run_id).status is RunStatus.FAILED
        history = [h.event for h in rt.history(run_id)]
        assert not [e for e in history if isinstance(e, Run.StepRecorded | Run.EffectPending)]
    assert all(r.used_requests == 0 for r in rt.store.rate_limit_rows())


def test_tool__unknown_limit_raises_the_lookup_error(rt: Runtime) -> None:
    """The error a bad limit name fails the run with names the limit (UnknownRateLimit)."""
    run_id = rt.enqueue("searcher", {"limit": "nope"})
    rt.work(burst=True)
    assert rt.get(run_id).state.error_type == UnknownRateLimit.__name__
