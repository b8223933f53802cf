"""Rate limits shared by every worker (ADR 0080) — the store's window and the steps that use
it, on both backends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any
from uuid import uuid4

import pytest

from steptrail import App, RunContext
from steptrail.domain import rate_limits as rate_limit_rules
from steptrail.domain.enums import RunStatus
from steptrail.domain.rate_limits import RateLimit, RateLimited, UnknownRateLimit
from steptrail.domain.run import Run
from steptrail.domain.waits import WaitStarted
from steptrail.render import waiting_for
from steptrail.runtime import Runtime
from steptrail.workers import rate_limits
from steptrail.workers.async_context import AsyncRunContext
from steptrail.workers.context import Recorded
from tests.conftest import make_runtime
from tests.integration.test_waits import drain_until

app = App()
app.rate_limit("hour", requests=3, tokens=100, per=3600)
app.rate_limit("brief", requests=1, per=0.6, margin=0)
FAILED_ONCE: set[str] = set()
CALLS: list[Any] = []


@app.agent("asker")
def asker(ctx: RunContext, request: dict[str, Any]) -> Any:
    return ctx.llm(
        "ask",
        lambda: Recorded("answer", tokens=request.get("used", 0)),
        limit=request.get("limit", "hour"),
        tokens=request.get("estimate"),
    )


@app.agent("sleepy_asker")
def sleepy_asker(ctx: RunContext, request: dict[str, Any]) -> Any:
    first = ctx.llm("ask", lambda: "a", limit="hour", tokens=10)
    ctx.sleep(0.3)
    return [first, ctx.step("plain", "after", lambda: "b")]


@app.agent("throttled")
def throttled(ctx: RunContext, request: dict[str, Any]) -> Any:
    def call() -> str:
        if request["key"] not in FAILED_ONCE:
            FAILED_ONCE.add(request["key"])
            raise RateLimited(retry_after=request["retry_after"])
        return "ok"

    return ctx.llm("ask", call, limit="hour", tokens=1)


@app.agent("counted")
def counted(ctx: RunContext, request: dict[str, Any]) -> Any:
    return ctx.llm("ask", lambda: CALLS.append(ctx.run_id) or "called", limit="brief")


@app.agent("async_asker")
async def async_asker(ctx: AsyncRunContext, request: dict[str, Any]) -> Any:
    async def call() -> str:
        return "async answer"

    return await ctx.llm("ask", call, limit="brief")


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    FAILED_ONCE.clear()
    CALLS.clear()
    runtime = make_runtime(db_url, app, privacy_level="full")
    yield runtime
    runtime.close()


def used(rt: Runtime, name: str) -> tuple[int, int]:
    (row,) = [r for r in rt.store.rate_limit_rows() if r.limit.name == name]
    return row.used_requests, row.used_tokens


def event_count(rt: Runtime) -> int:
    return sum(len(rt.history(r.run_id)) for r in rt.runs(limit=1000))


def test_acquire__concurrent_acquirers_never_overshoot(rt: Runtime) -> None:
    """Twelve threads acquiring at once against 3 requests an hour get exactly 3 grants;
    every other answer is a wait of about the hour (the lock on the limit's row)."""
    store = rt.store
    store.define_rate_limits([app.rate_limits["hour"]], by="test")
    start = threading.Barrier(12)
    answers = []
    lock = threading.Lock()

    def acquire() -> None:
        start.wait()
        answer = store.acquire_rate("hour", 1, uuid4())
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=acquire) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    granted = [a for a in answers if a.grant_id is not None]
    assert len(granted) == 3
    assert len({a.grant_id for a in granted}) == 3
    assert all(3590 < a.wait_s <= 3600.2 for a in answers if a.grant_id is None)
    assert used(rt, "hour") == (3, 3)


def test_define__workers_starting_together_store_one_row(rt: Runtime) -> None:
    """Eight workers storing the same limits at once (a deploy's start): no error, one row
    per limit, the definition intact."""
    limits = list(app.rate_limits.values())
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def define() -> None:
        start.wait()
        try:
            rt.store.define_rate_limits(limits, by="worker")
        except BaseException as error:  # collected: the assertion names it
            errors.append(error)

    threads = [threading.Thread(target=define) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [r.limit for r in rt.store.rate_limit_rows()] == sorted(limits, key=lambda x: x.name)


def test_acquire__the_window_slides_from_the_oldest_grant(rt: Runtime) -> None:
    """Two requests per 0.8 s: the third waits until the first grant leaves the window,
    not until a fixed window's boundary; once waited, it is granted."""
    limit = RateLimit("slide", requests=2, tokens=None, per_s=0.8, margin_s=0)
    store = rt.store
    store.define_rate_limits([limit], by="test")
    assert store.acquire_rate("slide", 0, uuid4()).grant_id is not None
    time.sleep(0.3)
    assert store.acquire_rate("slide", 0, uuid4()).grant_id is not None
    third = store.acquire_rate("slide", 0, uuid4())
    assert third.grant_id is None
    assert 0.3 < third.wait_s <= 0.5  # the first grant leaves at 0.8 s; 0.3 s have passed
    time.sleep(third.wait_s + 0.01)
    assert store.acquire_rate("slide", 0, uuid4()).grant_id is not None
    fourth = store.acquire_rate("slide", 0, uuid4())  # the second grant is still inside
    assert fourth.grant_id is None


def test_acquire__tokens_are_a_window_too_and_a_correction_frees_them(rt: Runtime) -> None:
    """60 of 100 tokens granted: 50 more must wait; corrected to 30, the 50 fit."""
    store = rt.store
    store.define_rate_limits([app.rate_limits["hour"]], by="test")
    first = store.acquire_rate("hour", 60, uuid4())
    assert first.grant_id is not None
    assert store.acquire_rate("hour", 50, uuid4()).grant_id is None
    store.correct_rate_grant(first.grant_id, 30)
    assert store.acquire_rate("hour", 50, uuid4()).grant_id is not None
    assert used(rt, "hour") == (2, 80)


def test_define__a_changed_definition_is_updated_and_a_block_kept(rt: Runtime) -> None:
    """A worker storing a changed limit changes it for everyone; a provider's block stays."""
    store = rt.store
    store.define_rate_limits([app.rate_limits["hour"]], by="test")
    store.block_rate_limit("hour", 30)
    changed = RateLimit("hour", requests=7, tokens=None, per_s=60)
    store.define_rate_limits([changed], by="deploy-2")
    (row,) = store.rate_limit_rows()
    assert (row.limit, row.updated_by) == (changed, "deploy-2")
    assert row.blocked_until is not None
    assert 29 < store.acquire_rate("hour", 0, uuid4()).wait_s <= 30.1


def test_step__acquires_once_and_the_reported_tokens_correct_the_estimate(
    rt: Runtime,
) -> None:
    """A live llm step takes one grant with its estimate; Recorded(tokens=) replaces it."""
    run_id = rt.enqueue("asker", {"estimate": 40, "used": 12})
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.COMPLETED
    assert used(rt, "hour") == (1, 12)


def test_step__replay_never_acquires(rt: Runtime) -> None:
    """A run that sleeps after its limited step replays that step on waking: still one
    grant, and the step ran once."""
    run_id = rt.enqueue("sleepy_asker")
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_TIMER
    drain_until(rt, run_id, RunStatus.COMPLETED)
    assert used(rt, "hour") == (1, 10)
    steps = [h.event for h in rt.history(run_id) if isinstance(h.event, Run.StepRecorded)]
    assert [s.name for s in steps] == ["ask", "sleep", "after"]


def test_step__a_short_wait_is_waited_in_place(rt: Runtime) -> None:
    """One request per 0.6 s: the second run's step waits in place (no suspension) and
    both complete in one burst."""
    first = rt.enqueue("asker", {"limit": "brief"})
    second = rt.enqueue("asker", {"limit": "brief"})
    rt.work(burst=True)
    for run_id in (first, second):
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert not [h for h in rt.history(run_id) if isinstance(h.event, WaitStarted)]


def test_step__a_run_cancelled_while_it_waits_in_place_never_calls(rt: Runtime) -> None:
    """The second run's step waits in place for the window; an operator cancels it
    meanwhile: once granted, the step proves the run is still its own first, so the call
    is never made and the run ends cancelled."""
    first = rt.enqueue("counted")
    second = rt.enqueue("counted")

    def cancel_when_running() -> None:
        deadline = time.monotonic() + 10
        while rt.get(second).status is not RunStatus.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        rt.cancel(second, by="ops")

    canceller = threading.Thread(target=cancel_when_running)
    canceller.start()
    rt.work(burst=True)
    canceller.join()
    assert rt.get(first).status is RunStatus.COMPLETED
    assert rt.get(second).status is RunStatus.CANCELLED
    assert [first] == CALLS


def test_step__a_long_wait_suspends_on_a_timer_and_wakes_to_try_again(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no patience, the second run suspends on the timer `rate_limit:brief` holding no
    lease; it wakes when the window allows, takes its grant and completes: no failure, no
    retry, the step ran once. (No burst horizon: the burst ends with the run asleep.)"""
    monkeypatch.setattr(rate_limits, "PATIENCE_S", 0.0)
    monkeypatch.setattr(rate_limit_rules, "BURST_HORIZON_S", 0.0)
    first = rt.enqueue("asker", {"limit": "brief"})
    second = rt.enqueue("asker", {"limit": "brief"})
    rt.work(burst=True)
    assert rt.get(first).status is RunStatus.COMPLETED
    row = rt.get(second)
    assert row.status is RunStatus.WAITING_FOR_TIMER
    assert row.state.holder is None
    assert row.state.waiting is not None
    assert row.state.waiting.name == "rate_limit:brief"
    assert waiting_for(row).startswith("rate limit 'brief' until ")  # runs, show, console
    drain_until(rt, second, RunStatus.COMPLETED)
    names = [type(h.event).__name__ for h in rt.history(second)]
    assert "Failed" not in names
    assert "Retried" not in names
    assert names.count("StepRecorded") == 1
    assert rt.get(second).state.requeue_count == 0  # no attempt spent on waiting


def test_step__a_429_blocks_the_limit_for_every_worker(rt: Runtime) -> None:
    """A limited step failing with RateLimited(retry_after=30) blocks the limit: the next
    acquire anywhere is told to wait about 30 s."""
    run_id = rt.enqueue("throttled", {"key": "a", "retry_after": 30})
    rt.work(burst=True)
    assert rt.get(run_id).status is not RunStatus.COMPLETED
    (row,) = [r for r in rt.store.rate_limit_rows() if r.limit.name == "hour"]
    assert row.blocked_until is not None
    assert 29 < rt.store.acquire_rate("hour", 0, uuid4()).wait_s <= 30.1


def test_step__a_429_with_an_http_date_blocks_until_that_date(rt: Runtime) -> None:
    """RateLimited given a Retry-After HTTP date 30 s ahead blocks the limit until about
    then (the date is whole seconds: between 28 and 30 s from the next acquire)."""
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    run_id = rt.enqueue("throttled", {"key": "dated", "retry_after": when})
    rt.work(burst=True)
    assert rt.get(run_id).status is not RunStatus.COMPLETED
    (row,) = [r for r in rt.store.rate_limit_rows() if r.limit.name == "hour"]
    assert row.blocked_until is not None
    assert 28 < rt.store.acquire_rate("hour", 0, uuid4()).wait_s <= 30.1


def test_step__bad_use_is_refused_with_nothing_granted(rt: Runtime) -> None:
    """An unknown limit, an estimate over the limit's tokens, or tokens= without limit=
    fail the run before the step: no grant, no step recorded."""
    bad = [
        rt.enqueue("asker", {"limit": "nope"}),
        rt.enqueue("asker", {"estimate": 101}),
        rt.enqueue("asker", {"estimate": -1}),
    ]
    rt.work(burst=True)
    for run_id in bad:
        assert rt.get(run_id).status is RunStatus.FAILED
        assert not [h for h in rt.history(run_id) if isinstance(h.event, Run.StepRecorded)]
    assert all(r.used_requests == 0 for r in rt.store.rate_limit_rows())


def test_acquire__an_unknown_limit_is_refused(rt: Runtime) -> None:
    """The store refuses a limit it keeps no definition of, and writes nothing."""
    before = event_count(rt)
    with pytest.raises(UnknownRateLimit):
        rt.store.acquire_rate("never-defined", 0, uuid4())
    assert rt.store.rate_limit_rows() == []
    assert event_count(rt) == before


def test_async_step__acquires_and_waits_on_the_loop(rt: Runtime) -> None:
    """Two async runs on one limit of 1 per 0.6 s: both complete, one grant each."""
    runs = [rt.enqueue("async_asker"), rt.enqueue("async_asker")]
    rt.work(burst=True, concurrency=2)
    for run_id in runs:
        drain_until(rt, run_id, RunStatus.COMPLETED)
    assert used(rt, "brief")[0] >= 1  # the older grant may have left the 0.6 s window


def test_async_step__a_long_wait_suspends_and_wakes(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async run whose grant must wait past its patience suspends on the limit's timer
    (raised from its store thread into the agent's task) and completes once woken."""
    monkeypatch.setattr(rate_limits, "PATIENCE_S", 0.0)
    monkeypatch.setattr(rate_limit_rules, "BURST_HORIZON_S", 0.0)
    first, second = rt.enqueue("async_asker"), rt.enqueue("async_asker")
    rt.work(burst=True)
    waiting = [r for r in (first, second) if rt.get(r).status is RunStatus.WAITING_FOR_TIMER]
    assert len(waiting) == 1
    drain_until(rt, waiting[0], RunStatus.COMPLETED)
    assert rt.get(first).status is rt.get(second).status is RunStatus.COMPLETED
