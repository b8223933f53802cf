"""Durable sleep, signals and deadlines on waits (ADR 0068, 0073) — on both backends."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from steptrail import App, RunContext, WaitTimedOut
from steptrail.domain.enums import RunStatus
from steptrail.domain.errors import IllegalTransition, InvalidInput, UnknownRun
from steptrail.domain.run import Run
from steptrail.domain.waits import WaitStarted, Woken
from steptrail.runtime import Runtime
from tests.conftest import make_runtime

CALLS: Counter[str] = Counter()
Completed = Run.Completed


class Payment(BaseModel):
    amount: int


app = App()
app.signal("paid", schema=Payment)


@app.agent("sleeper")
def sleeper(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    before = ctx.llm("before", lambda: CALLS.update(["before"]) or "b")
    ctx.sleep(request.get("seconds", 0.3))
    after = ctx.llm("after", lambda: CALLS.update(["after"]) or "a")
    return {"before": before, "after": after}


@app.agent("until")
def until(ctx: RunContext, request: dict[str, Any]) -> str:
    ctx.sleep_until(datetime.now(UTC) + timedelta(seconds=request["seconds"]))
    return "woke"


@app.agent("listener")
def listener(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    ctx.llm("first", lambda: CALLS.update(["first"]) or 1)
    got = []
    for _ in range(request.get("waits", 1)):
        try:
            got.append(ctx.wait_event(request.get("name", "go"), timeout=request.get("timeout")))
        except WaitTimedOut:
            got.append("timed out")
    return {"got": got}


@app.agent("payer")
def payer(ctx: RunContext, request: dict[str, Any]) -> Any:
    return ctx.wait_event("paid")


@app.agent("approver")
def approver(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    taken = ctx.request_approval(
        [{"name": "send_email", "arguments": {"to": "ops"}}], timeout=request["timeout"]
    )
    if taken.expired:
        return {"path": "fallback", "by": taken.by}
    return {"path": "approved" if taken.approved else "denied"}


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    CALLS.clear()
    runtime = make_runtime(db_url, app, privacy_level="full")
    yield runtime
    runtime.close()


def topics(rt: Runtime, run_id: UUID) -> list[str]:
    return [type(h.event).__name__ for h in rt.history(run_id)]


def result_of(rt: Runtime, run_id: UUID) -> Any:
    return next(h.event.result for h in rt.history(run_id) if isinstance(h.event, Completed))


def drain_until(rt: Runtime, run_id: UUID, status: RunStatus, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while rt.get(run_id).status is not status:
        assert time.monotonic() < deadline, f"{rt.get(run_id).status} is not {status}"
        rt.work(burst=True)
        time.sleep(0.05)


def test_sleep__releases_the_lease_and_wakes_at_its_time(rt: Runtime) -> None:
    """A sleeping run holds no lease; it is claimable at the store's clock + the duration,
    and the steps before the sleep are not run again."""
    run_id = rt.enqueue("sleeper", {"seconds": 0.4})
    rt.work(burst=True)
    row = rt.get(run_id)
    assert row.status is RunStatus.WAITING_FOR_TIMER
    assert (row.state.holder, row.lease_expires_at) == (None, None)
    assert row.available_at is not None
    assert row.available_at - row.updated_at == timedelta(milliseconds=400)
    assert row.state.waiting is not None
    assert row.state.waiting.seq == 2
    rt.work(burst=True)  # not due yet: nothing to claim
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_TIMER
    drain_until(rt, run_id, RunStatus.COMPLETED)
    assert Counter({"before": 1, "after": 1}) == CALLS
    trail = topics(rt, run_id)
    assert trail.count("WaitStarted") == 1
    steps = [h.event for h in rt.history(run_id) if type(h.event).__name__ == "StepRecorded"]
    assert [(s.kind, s.name) for s in steps] == [
        ("llm", "before"),
        ("sleep", "sleep"),
        ("llm", "after"),
    ]
    assert result_of(rt, run_id) == {"result": {"before": "b", "after": "a"}}


def test_sleep__the_woken_segment_appends_once(rt: Runtime) -> None:
    """A woken segment's replay note and the sleep's outcome record no effect (ADR 0085):
    they ride with the settle, so the segment after a sleep costs its claim and one append
    (before: three), and the trail keeps their order."""
    run_id = rt.enqueue("sleeper", {"seconds": 0.2})
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_TIMER
    store: Any = rt.store
    appended: list[list[str]] = []
    real = store.append

    def counting(run: Run, **kwargs: Any) -> Any:
        appended.append([type(e).__name__ for e in run.pending_events])
        return real(run, **kwargs)

    store.append = counting
    try:
        drain_until(rt, run_id, RunStatus.COMPLETED)
    finally:
        del store.append
    assert appended == [["Replayed", "StepRecorded", "StepRecorded", "Completed"]]
    assert topics(rt, run_id)[-5:] == [
        "Claimed",
        "Replayed",
        "StepRecorded",
        "StepRecorded",
        "Completed",
    ]
    assert Counter({"before": 1, "after": 1}) == CALLS


@app.agent("careful")
def careful(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    try:
        ctx.llm("flaky", _flaky)
    except Exception:  # replayed, the failure is a ReplayedError: catch Exception
        CALLS.update(["caught"])
    if request.get("event"):
        got = ctx.wait_event("go", timeout=5)
    else:
        ctx.sleep(0.2)
        got = None
    return {"after": ctx.llm("after", lambda: CALLS.update(["after"]) or "a"), "got": got}


def _flaky() -> None:
    CALLS.update(["flaky"])
    raise ValueError("the provider said no")


@pytest.mark.parametrize("wait", ["sleep", "event"])
def test_wait__after_a_caught_failure_ends_once(rt: Runtime, wait: str) -> None:
    """A failed step the agent caught, then a wait, as the journal's last entries: the woken
    segment replays the failure (it does not run that step again, which would move the
    wait to another step seq and make the run wait again, for ever) and goes on."""
    run_id = rt.enqueue("careful", {"event": wait == "event"})
    rt.work(burst=True)
    assert rt.get(run_id).status.is_waiting
    if wait == "event":
        rt.signal(run_id, "go", {"n": 1})
    drain_until(rt, run_id, RunStatus.COMPLETED)
    assert CALLS["flaky"] == 1
    assert CALLS["caught"] == 2  # live, then replayed
    assert topics(rt, run_id).count("WaitStarted") == 1
    assert result_of(rt, run_id) == {
        "result": {"after": "a", "got": {"n": 1} if wait == "event" else None}
    }


def test_sleep_until__a_past_instant_only_records(rt: Runtime) -> None:
    """sleep_until a past instant does not suspend; a future one does."""
    done = rt.enqueue("until", {"seconds": -5})
    rt.work(burst=True)
    assert rt.get(done).status is RunStatus.COMPLETED
    later = rt.enqueue("until", {"seconds": 0.3})
    rt.work(burst=True)
    assert rt.get(later).status is RunStatus.WAITING_FOR_TIMER
    drain_until(rt, later, RunStatus.COMPLETED)


def test_sleep__bad_durations_fail_the_run_with_nothing_waited(rt: Runtime) -> None:
    """A negative or NaN duration is the agent's bug: the run fails, it never waits."""
    run_id = rt.enqueue("sleeper", {"seconds": -1})
    rt.work(burst=True)
    row = rt.get(run_id)
    assert row.status is RunStatus.FAILED
    assert "WaitStarted" not in topics(rt, run_id)


def test_signal__wakes_a_waiting_run_exactly_once(rt: Runtime) -> None:
    """A signal to a run waiting for it queues the run (Woken, fenced); the run gets the
    payload and the step before the wait is not run again."""
    run_id = rt.enqueue("listener", {})
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_EVENT
    sent = rt.signal(run_id, "go", {"n": 1}, by="webhook")
    assert (sent.seq, sent.woke) == (1, True)
    assert rt.get(run_id).status is RunStatus.QUEUED
    rt.work(burst=True)
    row = rt.get(run_id)
    assert row.status is RunStatus.COMPLETED
    assert CALLS["first"] == 1
    assert topics(rt, run_id).count("Woken") == 1
    woken = next(h.event for h in rt.history(run_id) if isinstance(h.event, Woken))
    assert (woken.name, woken.signal_seq, woken.actor) == ("go", 1, "webhook")


def test_signal__before_the_wait_is_kept_and_consumed_in_order(rt: Runtime) -> None:
    """Signals sent while the run is queued (claimed by nobody) are kept; two waits for the
    same name take them in order, and the run never suspends."""
    run_id = rt.enqueue("listener", {"waits": 2})
    assert not rt.signal(run_id, "go", "one").woke
    assert not rt.signal(run_id, "go", "two").woke
    rt.work(burst=True)
    row = rt.get(run_id)
    assert row.status is RunStatus.COMPLETED
    assert "WaitStarted" not in topics(rt, run_id)
    assert result_of(rt, run_id) == {"result": {"got": ["one", "two"]}}
    steps = [h.event for h in rt.history(run_id) if type(h.event).__name__ == "StepRecorded"]
    assert [s.payload.get("signal") for s in steps if s.kind == "event"] == [1, 2]


def test_signal__to_a_settled_or_unknown_run_is_refused_with_nothing_written(
    rt: Runtime,
) -> None:
    """A signal to a completed run or to no run is refused, and nothing is stored."""
    run_id = rt.enqueue("listener", {})
    rt.signal(run_id, "go", 1)
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.COMPLETED
    version = rt.get(run_id).state.version
    with pytest.raises(IllegalTransition, match="settled"):
        rt.signal(run_id, "go", 2)
    assert rt.get(run_id).state.version == version
    assert [s["seq"] for s in rt.store.signals(run_id)] == [1]
    with pytest.raises(UnknownRun):
        rt.signal(UUID(int=7), "go", 1)


def test_signal__bad_input_is_refused_before_anything_is_written(rt: Runtime) -> None:
    """Bad names, payloads too deep or large, and payloads that fail the declared schema are
    refused; the inbox stays empty."""
    run_id = rt.enqueue("payer", {})
    with pytest.raises(ValueError, match="signal name"):
        rt.signal(run_id, "", 1)
    with pytest.raises(ValueError, match="signal name"):
        rt.signal(run_id, " padded ", 1)
    deep: Any = 1
    for _ in range(200):
        deep = [deep]
    with pytest.raises(InvalidInput, match="nests more than"):
        rt.signal(run_id, "go", deep)
    with pytest.raises(InvalidInput, match="bytes"):
        rt.signal(run_id, "go", "x" * (rt.settings.max_payload_bytes + 10))
    with pytest.raises(InvalidInput, match="invalid payload for signal 'paid'"):
        rt.signal(run_id, "paid", {"amount": "lots"})
    assert rt.store.signals(run_id) == []
    rt.signal(run_id, "paid", {"amount": 5})
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.COMPLETED


def test_wait_event__timeout_ends_the_wait_and_the_agent_handles_it(rt: Runtime) -> None:
    """Nobody signals within the timeout: the claim takes the run at its deadline and the
    wait raises WaitTimedOut, which the agent handles; a later signal is refused."""
    run_id = rt.enqueue("listener", {"timeout": 0.3})
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_EVENT
    drain_until(rt, run_id, RunStatus.COMPLETED)
    steps = [h.event for h in rt.history(run_id) if type(h.event).__name__ == "StepRecorded"]
    assert steps[-1].kind == "event"
    assert steps[-1].payload == {"timed_out": True}
    with pytest.raises(IllegalTransition):
        rt.signal(run_id, "go", 1)


def test_wait_event__a_signal_that_beats_the_deadline_wins(rt: Runtime) -> None:
    """A signal delivered before the deadline wakes the run; the deadline then changes
    nothing."""
    run_id = rt.enqueue("listener", {"timeout": 30})
    rt.work(burst=True)
    assert rt.signal(run_id, "go", "yes").woke
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.COMPLETED


def test_approval_timeout__nobody_answers_and_the_fallback_runs(rt: Runtime) -> None:
    """An approval with timeout= that nobody answers expires: the agent's fallback runs, and
    an approval sent after the expiry is refused with a clear message."""
    run_id = rt.enqueue("approver", {"timeout": 0.3})
    rt.work(burst=True)
    row = rt.get(run_id)
    assert row.status is RunStatus.WAITING_FOR_APPROVAL
    assert row.available_at is not None
    time.sleep(0.35)
    with pytest.raises(IllegalTransition, match="expired"):
        rt.approve(run_id, by="alice")
    drain_until(rt, run_id, RunStatus.COMPLETED)
    assert "Decided" not in topics(rt, run_id)
    steps = [h.event for h in rt.history(run_id) if type(h.event).__name__ == "StepRecorded"]
    assert steps[-1].kind == "decision"
    assert steps[-1].payload.get("expired") is True
    with pytest.raises(IllegalTransition):
        rt.approve(run_id, by="alice")


def test_approval_timeout__answered_in_time_resumes_as_usual(rt: Runtime) -> None:
    """Approved before its deadline, the run resumes and the deadline is gone."""
    run_id = rt.enqueue("approver", {"timeout": 30})
    rt.work(burst=True)
    rt.approve(run_id, by="alice")
    assert rt.get(run_id).available_at is not None  # queued now, for a worker
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.COMPLETED


def test_rebuilt_index_equals_the_live_one_through_every_wait(rt: Runtime) -> None:
    """The run index's rows (available_at included) rebuilt from the log equal the live
    rows for sleeping, event-waiting and woken runs."""
    sleeping = rt.enqueue("sleeper", {"seconds": 60})
    waiting = rt.enqueue("listener", {"timeout": 60})
    woken = rt.enqueue("listener", {})
    rt.work(burst=True)
    rt.signal(woken, "go", 1)
    assert rt.verify_index() == []
    assert {rt.get(r).status for r in (sleeping, waiting, woken)} == {
        RunStatus.WAITING_FOR_TIMER,
        RunStatus.WAITING_FOR_EVENT,
        RunStatus.QUEUED,
    }


def test_cancel__a_sleeping_run_is_cancelled_and_never_wakes(rt: Runtime) -> None:
    """Cancelling a waiting run settles it; its deadline no longer makes it claimable."""
    run_id = rt.enqueue("sleeper", {"seconds": 0.2})
    rt.work(burst=True)
    rt.cancel(run_id)
    time.sleep(0.3)
    rt.work(burst=True)
    row = rt.get(run_id)
    assert (row.status, row.available_at) == (RunStatus.CANCELLED, None)
    started = [h.event for h in rt.history(run_id) if isinstance(h.event, WaitStarted)]
    assert [(w.kind.value, w.timeout_ms) for w in started] == [("timer", 200)]
