"""An agent's run-level rate limit (ADR 0083): one grant per run, taken before the agent's
code runs, never again on replay; without a grant the run sleeps on `rate_limit:NAME`. On
both backends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from steptrail import App, RunContext
from steptrail.domain.enums import RunStatus
from steptrail.domain.rate_limits import InvalidRateLimit
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
from steptrail.workers import rate_limits
from steptrail.workers.async_context import AsyncRunContext
from steptrail.workers.requests import InvalidRequest
from tests.conftest import make_runtime
from tests.integration.test_waits import drain_until

ENTERED: list[UUID] = []
CALLS: list[str] = []


def define(app: App, *, gated: bool) -> App:
    """The app of these tests; `gated=False` defines the same agents without the option
    (a deploy before or after it)."""
    app.rate_limit("hour", requests=3, tokens=100, per=3600)
    app.rate_limit("brief", requests=1, per=0.6, margin=0)
    gate: dict[str, Any] = {"rate_limit": "hour", "rate_limit_tokens": 10} if gated else {}
    brief: dict[str, Any] = {"rate_limit": "brief"} if gated else {}

    @app.agent("gated", **gate)
    def gated_agent(ctx: RunContext, request: dict[str, Any]) -> Any:
        ENTERED.append(ctx.run_id)
        first = ctx.step("plain", "first", lambda: "a")
        if request.get("sleep"):
            ctx.sleep(0.3)
        return [first, ctx.step("plain", "after", lambda: "b")]

    @app.agent("brief_gated", **brief)
    def brief_agent(ctx: RunContext, request: dict[str, Any]) -> Any:
        ENTERED.append(ctx.run_id)
        return ctx.step("plain", "only", lambda: "done")

    @app.agent("async_gated", **brief)
    async def async_agent(ctx: AsyncRunContext, request: dict[str, Any]) -> Any:
        ENTERED.append(ctx.run_id)

        async def only() -> str:
            return "done"

        return await ctx.step("plain", "only", only)

    app.tool("send_email", effect="non_idempotent_write")

    @app.agent("by_hand", **gate)
    def by_hand(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        if ctx.resumed is None:
            CALLS.append("draft")
            ctx.llm("draft", lambda: "d")
            ctx.request_approval([{"name": "send_email", "arguments": {}}])
        ctx.run_pending({"send_email": lambda: CALLS.append("send") or "sent"})
        ctx.llm("after", lambda: CALLS.append("after") or "a")
        return {}

    return app


app = define(App(), gated=True)


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    ENTERED.clear()
    CALLS.clear()
    runtime = make_runtime(db_url, app, privacy_level="full")
    yield runtime
    runtime.close()


def used(rt: Runtime, name: str) -> tuple[int, int]:
    (row,) = [r for r in rt.store.rate_limit_rows() if r.limit.name == name]
    return row.used_requests, row.used_tokens


def steps(rt: Runtime, run_id: UUID) -> list[tuple[str, str]]:
    return [
        (h.event.kind, h.event.name)
        for h in rt.history(run_id)
        if isinstance(h.event, Run.StepRecorded)
    ]


def test_run_limit__one_grant_before_the_agent_and_none_on_replay(rt: Runtime) -> None:
    """A gated run takes one grant (its estimate) as a `rate_limit` step at position 1; the
    segment after its sleep replays it and takes none."""
    run_id = rt.enqueue("gated", {"sleep": True})
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_TIMER
    drain_until(rt, run_id, RunStatus.COMPLETED)
    assert used(rt, "hour") == (1, 10)
    assert steps(rt, run_id) == [
        ("rate_limit", "hour"),
        ("plain", "first"),
        ("sleep", "sleep"),
        ("plain", "after"),
    ]
    assert [run_id, run_id] == ENTERED  # two segments, one grant


def test_run_limit__without_a_grant_the_run_sleeps_before_its_code(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no patience, the second run of a 1-per-0.6 s limit sleeps on `rate_limit:brief`
    holding no lease and without running any of its code; woken, it runs once."""
    monkeypatch.setattr(rate_limits, "PATIENCE_S", 0.0)
    monkeypatch.setattr("steptrail.domain.rate_limits.BURST_HORIZON_S", 0.0)
    first, second = rt.enqueue("brief_gated"), rt.enqueue("brief_gated")
    rt.work(burst=True)
    assert rt.get(first).status is RunStatus.COMPLETED
    row = rt.get(second)
    assert row.status is RunStatus.WAITING_FOR_TIMER
    assert row.state.holder is None
    assert row.state.waiting is not None
    assert row.state.waiting.name == "rate_limit:brief"
    assert second not in ENTERED
    assert steps(rt, second) == []
    drain_until(rt, second, RunStatus.COMPLETED)
    assert [first, second] == ENTERED
    names = [type(h.event).__name__ for h in rt.history(second)]
    assert "Failed" not in names
    assert rt.get(second).state.requeue_count == 0


def test_run_limit__async_agent_sleeps_before_its_code(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for an async agent: one of two runs sleeps on the limit without entering
    its code, and both complete once it wakes."""
    monkeypatch.setattr(rate_limits, "PATIENCE_S", 0.0)
    monkeypatch.setattr("steptrail.domain.rate_limits.BURST_HORIZON_S", 0.0)
    runs = [rt.enqueue("async_gated"), rt.enqueue("async_gated")]
    rt.work(burst=True)
    waiting = [r for r in runs if rt.get(r).status is RunStatus.WAITING_FOR_TIMER]
    assert len(waiting) == 1
    assert waiting[0] not in ENTERED
    drain_until(rt, waiting[0], RunStatus.COMPLETED)
    for run_id in runs:
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert steps(rt, run_id) == [("rate_limit", "brief"), ("plain", "only")]
    assert sorted(map(str, ENTERED)) == sorted(map(str, runs))


def test_run_limit__a_short_wait_is_waited_in_place(rt: Runtime) -> None:
    """Two gated runs on 1 per 0.6 s in one burst: the second waits in place, no sleep."""
    runs = [rt.enqueue("brief_gated"), rt.enqueue("brief_gated")]
    rt.work(burst=True)
    for run_id in runs:
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert [type(h.event).__name__ for h in rt.history(run_id)].count("WaitStarted") == 0


def test_run_limit__a_run_started_before_the_option_takes_no_grant(db_url: str) -> None:
    """A run that began under code without the option (its journal starts with its own
    step) finishes under code with it: no grant, no divergence."""
    before = make_runtime(db_url, define(App(), gated=False), privacy_level="full")
    try:
        run_id = before.enqueue("gated", {"sleep": True})
        before.work(burst=True)
        assert before.get(run_id).status is RunStatus.WAITING_FOR_TIMER
    finally:
        before.close()
    after = make_runtime(db_url, app, privacy_level="full")
    try:
        drain_until(after, run_id, RunStatus.COMPLETED)
        assert ("rate_limit", "hour") not in steps(after, run_id)
        assert all(r.used_requests == 0 for r in after.store.rate_limit_rows())
    finally:
        after.close()


def test_run_limit__a_run_outlives_the_option_being_removed(rt: Runtime, db_url: str) -> None:
    """A gated run asleep when the option is removed replays its `rate_limit` step by its
    own name under the new code and completes, taking nothing more."""
    run_id = rt.enqueue("gated", {"sleep": True})
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_TIMER
    after = make_runtime(db_url, define(App(), gated=False), privacy_level="full")
    try:
        drain_until(after, run_id, RunStatus.COMPLETED)
        assert steps(after, run_id)[0] == ("rate_limit", "hour")
        assert used(after, "hour") == (1, 10)
    finally:
        after.close()


def test_run_limit__an_agent_resuming_by_hand_after_its_grant(rt: Runtime) -> None:
    """A gated agent that reads `ctx.resumed` first and skips its earlier steps by hand
    resumes after an approval as before: the replayed grant does not count as its own
    step, so nothing mismatches, and the grant was taken once."""
    run_id = rt.enqueue("by_hand")
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_APPROVAL
    rt.approve(run_id, by="alice", resume="here")
    assert CALLS == ["draft", "send", "after"]
    assert rt.get(run_id).status is RunStatus.COMPLETED
    assert used(rt, "hour") == (1, 10)


def test_run_limit__an_undefined_limit_is_refused_at_enqueue(db_url: str) -> None:
    """An agent naming a limit the App never defines: its enqueue is refused, naming the
    limit, and nothing is written."""
    other = App()

    @other.agent("orphan", rate_limit="nowhere")
    def orphan(ctx: RunContext, request: dict[str, Any]) -> None:
        return None

    runtime = make_runtime(db_url, other)
    try:
        with pytest.raises(InvalidRequest, match="'nowhere'"):
            runtime.enqueue("orphan")
        assert runtime.runs(limit=10) == []
    finally:
        runtime.close()


def test_run_limit__bad_options_are_refused_at_registration() -> None:
    """tokens without a limit, a malformed name, or an estimate over a defined limit's tokens
    are refused when the agent is registered."""
    bad = App()
    bad.rate_limit("small", tokens=5, per=60)

    def fn(ctx: RunContext, request: dict[str, Any]) -> None:
        return None

    with pytest.raises(InvalidRateLimit, match="give rate_limit="):
        bad.add_agent("a", fn, rate_limit_tokens=3)
    with pytest.raises(InvalidRateLimit, match="name"):
        bad.add_agent("b", fn, rate_limit="bad name!")
    with pytest.raises(InvalidRateLimit, match="can never pass"):
        bad.add_agent("c", fn, rate_limit="small", rate_limit_tokens=6)
    with pytest.raises(InvalidRateLimit, match="at least 0"):
        bad.add_agent("d", fn, rate_limit="later", rate_limit_tokens=-1)
    assert bad.agent_names == []
