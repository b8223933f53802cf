"""Child runs (ADR 0075, 0081) — on both backends: start once, wait, fail, time out,
cancel as a family, show both ways, purge, and bad input refused with nothing written."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import pytest
from pydantic import BaseModel

from steptrail import (
    App,
    AsyncRunContext,
    ChildFailed,
    ChildHandle,
    RunContext,
    WaitTimedOut,
)
from steptrail.domain.classifier import ClassifiedError
from steptrail.domain.enums import FailureClass, RunStatus
from steptrail.domain.run import Run
from steptrail.runtime import InvalidRequest, Runtime
from steptrail.testing import Kit, crash_at
from steptrail.workers.registry import UnknownAgent
from tests.conftest import make_runtime

CALLS: Counter[str] = Counter()
app = App()


@app.agent("square")
def square(ctx: RunContext, request: dict[str, Any]) -> int:
    CALLS.update(["square"])
    return int(request["x"]) ** 2


@app.agent("boom")
def boom(ctx: RunContext, request: dict[str, Any]) -> None:
    raise ClassifiedError(FailureClass.AUTH, "no key")


@app.agent("hold")
def hold(ctx: RunContext, request: dict[str, Any]) -> Any:
    return ctx.wait_event("go")


@app.agent("fanout")
def fanout(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    handles = [ctx.start_child("square", {"x": x}) for x in range(request.get("n", 3))]
    return {"squares": ctx.wait_all(handles, timeout=request.get("timeout"))}


@app.agent("keyed")
def keyed(ctx: RunContext, request: dict[str, Any]) -> list[str]:
    a = ctx.start_child("square", {"x": 2}, key="a")
    b = ctx.start_child("square", {"x": 3}, key="a")  # the same key: the same child
    return [str(a.run_id), str(b.run_id)]


@app.agent("first")
def first(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    slow = ctx.start_child("hold", {})
    fast = ctx.start_child("square", {"x": 4})
    done, value = ctx.wait_any([slow, fast])
    return {"first": str(done.run_id), "value": value, "fast": str(fast.run_id)}


@app.agent("careful")
def careful(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    child = ctx.start_child(request.get("agent", "boom"), {})
    try:
        return {"value": ctx.wait_child(child, timeout=request.get("timeout"))}
    except ChildFailed as failed:
        return {"status": failed.status, "class": failed.failure_class, "reason": failed.reason}
    except WaitTimedOut:
        return {"timed_out": True}


@app.agent("grandparent")
def grandparent(ctx: RunContext, request: dict[str, Any]) -> Any:
    return ctx.wait_child(ctx.start_child("parent", {}))


@app.agent("parent")
def parent(ctx: RunContext, request: dict[str, Any]) -> Any:
    return ctx.wait_child(ctx.start_child("hold", {}))


@app.agent("async_fanout")
async def async_fanout(ctx: AsyncRunContext, request: dict[str, Any]) -> list[Any]:
    handles = [await ctx.start_child("square", {"x": x}) for x in range(3)]
    return await ctx.wait_all(handles)


@app.agent("private", privacy="none")
def private(ctx: RunContext, request: dict[str, Any]) -> Any:
    return ctx.wait_child(ctx.start_child("square", {"x": 5}))


class Number(BaseModel):
    x: int


@app.agent("typed", request_model=Number)
def typed(ctx: RunContext, request: dict[str, Any]) -> int:
    return int(request["x"])


@app.agent("spawns")
def spawns(ctx: RunContext, request: dict[str, Any]) -> Any:
    try:
        ctx.start_child(request["agent"], request.get("request"))
    except (UnknownAgent, InvalidRequest) as error:
        return type(error).__name__
    return "started"


@app.agent("misuse")
def misuse(ctx: RunContext, request: dict[str, Any]) -> list[str]:
    """Every wrong way to wait, each refused before anything is written."""
    foreign = ChildHandle(uuid4(), "square", uuid4())
    attempts = [
        lambda: ctx.wait_any([]),
        lambda: ctx.wait_child(foreign),
        lambda: ctx.wait_all(["not a handle"]),  # type: ignore[list-item]
        lambda: ctx.wait_event("steptrail.child:x"),
        lambda: ctx.start_child("square", {"x": 1}, key=""),
        lambda: ctx.wait_child(foreign, timeout=-1),
    ]
    refused = []
    for attempt in attempts:
        try:
            attempt()
        except (TypeError, ValueError) as error:
            refused.append(type(error).__name__)
    return refused


# The race test's hook: run inside the parent's step, between start_child and wait_child.
BETWEEN: list[Any] = []


@app.agent("racer")
def racer(ctx: RunContext, request: dict[str, Any]) -> Any:
    child = ctx.start_child("square", {"x": 6})
    ctx.llm("meanwhile", lambda: [hook(child.run_id) for hook in BETWEEN] and "done")
    return ctx.wait_child(child)


@app.agent("own_key", concurrency_key="mailbox:ops", concurrency_limit=1)
def own_key(ctx: RunContext, request: dict[str, Any]) -> str:
    return "own"


@app.agent("tenant_parent")
def tenant_parent(ctx: RunContext, request: dict[str, Any]) -> list[Any]:
    handles = [ctx.start_child("square", {"x": x}) for x in range(3)]
    handles.append(ctx.start_child("own_key", {}))
    return ctx.wait_all(handles)


app.limit("tenant:*", 1)


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    CALLS.clear()
    runtime = make_runtime(db_url, app, privacy_level="full")
    yield runtime
    runtime.close()


def result_of(rt: Runtime, run_id: UUID) -> Any:
    return next(h.event.result for h in rt.history(run_id) if isinstance(h.event, Run.Completed))


def drain(rt: Runtime, *run_ids: UUID, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not all(rt.get(r).status.is_terminal for r in run_ids):
        assert time.monotonic() < deadline, [rt.get(r).status for r in run_ids]
        rt.work(burst=True)
        time.sleep(0.02)


def children_of(rt: Runtime, run_id: UUID) -> list[Any]:
    return rt.store.children(run_id)


def event_count(rt: Runtime) -> int:
    return sum(len(rt.history(r.run_id)) for r in rt.store.all_rows())


def test_fanout__children_run_once_and_the_parent_gets_every_result(rt: Runtime) -> None:
    """wait_all returns each child's result in order; each child ran once; the parent
    waited without a lease; its children name it, and it lists them."""
    run_id = rt.enqueue("fanout", {"n": 3})
    rt.work(burst=True)
    row = rt.get(run_id)
    if row.status is RunStatus.WAITING_FOR_EVENT:
        assert (row.state.holder, row.lease_expires_at) == (None, None)
    drain(rt, run_id)
    assert result_of(rt, run_id) == {"result": {"squares": [0, 1, 4]}}
    kids = children_of(rt, run_id)
    assert len(kids) == 3
    assert all(k.state.parent_id == run_id for k in kids)
    assert sorted(k.state.parent_seq for k in kids) == [1, 2, 3]
    assert {k.status for k in kids} == {RunStatus.COMPLETED}
    assert CALLS["square"] == 3
    queued = rt.history(kids[0].run_id)[0].event
    assert isinstance(queued, Run.Queued)
    assert (queued.parent_id, queued.actor) == (run_id, f"parent:{run_id}")
    # The index rebuilt from the log keeps the parent column (migration 0034).
    assert rt.verify_index() == []
    rt.rebuild("run-index")
    assert sorted(k.run_id for k in children_of(rt, run_id)) == sorted(k.run_id for k in kids)


def test_start_child__a_crash_after_the_enqueue_creates_the_child_once(rt: Runtime) -> None:
    """The parent dies after the child's enqueue and before the step's record: the replay
    enqueues under the same key and finds the child it created."""
    kit = Kit(rt)
    run_id = kit.enqueue("fanout", {"n": 2})
    result = kit.drive(run_id, faults=[crash_at(1)])
    assert result.crashes == 1
    assert result.row.status is RunStatus.COMPLETED
    assert result_of(rt, run_id) == {"result": {"squares": [0, 1]}}
    assert len(children_of(rt, run_id)) == 2
    assert len(rt.store.all_rows()) == 3


def test_start_child__the_same_key_names_the_same_child(rt: Runtime) -> None:
    run_id = rt.enqueue("keyed", {})
    drain(rt, run_id)
    a, b = result_of(rt, run_id)["result"]
    assert a == b
    assert len(children_of(rt, run_id)) == 1


def test_wait_any__the_first_child_to_settle_wins(rt: Runtime) -> None:
    run_id = rt.enqueue("first", {})
    drain(rt, run_id)
    got = result_of(rt, run_id)["result"]
    assert (got["first"], got["value"]) == (got["fast"], 16)
    slow = next(k for k in children_of(rt, run_id) if k.state.agent == "hold")
    assert rt.get(slow.run_id).status is RunStatus.WAITING_FOR_EVENT


def test_wait_child__a_failed_child_raises_with_its_class(rt: Runtime) -> None:
    run_id = rt.enqueue("careful", {"agent": "boom"})
    drain(rt, run_id)
    assert result_of(rt, run_id)["result"] == {
        "status": "failed",
        "class": "auth",
        "reason": "not_retryable",
    }


def test_wait_child__a_cancelled_child_raises_too(rt: Runtime) -> None:
    run_id = rt.enqueue("careful", {"agent": "hold"})
    rt.work(burst=True)
    rt.work(burst=True)
    (child,) = children_of(rt, run_id)
    rt.cancel(child.run_id, by="ops")
    assert rt.get(run_id).status is RunStatus.QUEUED  # woken in the cancel's transaction
    drain(rt, run_id)
    assert result_of(rt, run_id)["result"] == {
        "status": "cancelled",
        "class": None,
        "reason": "cancelled",
    }


def test_wait_child__timeout_ends_the_wait(rt: Runtime) -> None:
    run_id = rt.enqueue("careful", {"agent": "hold", "timeout": 0.3})
    drain(rt, run_id)
    assert result_of(rt, run_id)["result"] == {"timed_out": True}
    (child,) = children_of(rt, run_id)
    assert rt.get(child.run_id).status is RunStatus.WAITING_FOR_EVENT


def test_cancel__cascades_to_unfinished_children_recursively(rt: Runtime) -> None:
    top = rt.enqueue("grandparent", {})
    for _ in range(4):
        rt.work(burst=True)
    (mid,) = children_of(rt, top)
    (leaf,) = children_of(rt, mid.run_id)
    assert rt.get(leaf.run_id).status is RunStatus.WAITING_FOR_EVENT
    rt.cancel(top, by="ops")
    assert [rt.get(r).status for r in (top, mid.run_id, leaf.run_id)] == [RunStatus.CANCELLED] * 3
    leaf_cancel = rt.history(leaf.run_id)[-1].event
    assert isinstance(leaf_cancel, Run.Cancelled)
    assert leaf_cancel.actor == f"parent:{mid.run_id}"


def test_cancel__keep_children_leaves_them_running(rt: Runtime) -> None:
    run_id = rt.enqueue("parent", {})
    rt.work(burst=True)
    rt.work(burst=True)
    (child,) = children_of(rt, run_id)
    rt.cancel(run_id, by="ops", keep_children=True)
    assert rt.get(child.run_id).status is RunStatus.WAITING_FOR_EVENT


def test_async_agent__starts_and_waits_for_children(rt: Runtime) -> None:
    run_id = rt.enqueue("async_fanout", {})
    drain(rt, run_id)
    assert result_of(rt, run_id) == {"result": [0, 1, 4]}


def test_privacy__a_child_keeps_its_parents_stricter_level(rt: Runtime) -> None:
    """The child's Completed event is filtered at the parent's level (none), yet the
    parent gets the result: the signal carries it, outside the log."""
    run_id = rt.enqueue("private", {})
    drain(rt, run_id)
    (child,) = children_of(rt, run_id)
    assert child.state.parent_privacy is not None
    assert result_of(rt, child.run_id) != {"result": 25}
    assert rt.get(run_id).status is RunStatus.COMPLETED
    assert [s["name"] for s in rt.store.signals(run_id)] == [f"steptrail.child:{child.run_id}"]


def test_bad_input__refused_with_nothing_written(rt: Runtime) -> None:
    """A user signal in steptrail's namespace, an unknown child agent or a bad request:
    refused, and not one event more."""
    run_id = rt.enqueue("hold", {})
    rt.work(burst=True)
    before = event_count(rt)
    with pytest.raises(ValueError, match="reserved"):
        rt.signal(run_id, "steptrail.child:x", {})
    assert event_count(rt) == before
    assert rt.store.signals(run_id) == []

    spawner = rt.enqueue("spawns", {"agent": "nobody"})
    typed = rt.enqueue("spawns", {"agent": "typed", "request": {"x": "not a number"}})
    drain(rt, spawner, typed)
    assert result_of(rt, spawner) == {"result": "UnknownAgent"}
    assert result_of(rt, typed) == {"result": "InvalidRequest"}
    for refused in (spawner, typed):
        assert children_of(rt, refused) == []
        steps = [h.event for h in rt.history(refused) if isinstance(h.event, Run.StepRecorded)]
        assert steps == []


def test_show__links_parent_and_children_both_ways(rt: Runtime) -> None:
    run_id = rt.enqueue("parent", {})
    rt.work(burst=True)
    rt.work(burst=True)
    (child,) = children_of(rt, run_id)
    family = rt.family(run_id)
    assert (family.parent_id, family.parent) == (None, None)
    assert family.children == [(child.run_id, "hold", RunStatus.WAITING_FOR_EVENT)]
    up = rt.family(child.run_id)
    assert up.parent == (run_id, "parent", RunStatus.WAITING_FOR_EVENT)
    assert up.children == []


def test_race__a_child_settling_after_the_parents_look_is_taken_not_lost(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child settles while the parent runs, and the parent's look into its inbox is
    made to miss it (as if it had looked an instant before the settle committed): the
    suspending append, reading the inbox under the parent's row lock, finds the signal, so
    the parent takes it without suspending, instead of waiting for a wake-up never sent."""
    other = Kit(rt)
    BETWEEN[:] = [other.drive]
    monkeypatch.setattr(rt.store, "next_signal", lambda *a: None)
    try:
        run_id = rt.enqueue("racer", {})
        rt.work(burst=True)
    finally:
        BETWEEN.clear()
    assert rt.get(run_id).status is RunStatus.COMPLETED
    assert result_of(rt, run_id) == {"result": 36}
    trail = [type(h.event).__name__ for h in rt.history(run_id)]
    assert "WaitStarted" not in trail


def test_purge__a_child_outliving_its_purged_parent_says_so(rt: Runtime) -> None:
    """A parent cancelled with --keep-children and purged: its child is still there, names
    the parent, and show says it was purged (its tombstone); the family's completed runs
    are purged like any others."""
    from tests.integration.test_retention import age

    run_id = rt.enqueue("parent", {})
    rt.work(burst=True)
    rt.work(burst=True)
    (child,) = children_of(rt, run_id)
    rt.cancel(run_id, by="ops", keep_children=True)
    age(rt, [run_id], days=40)
    report = rt.purge(days=30)
    assert report.total >= 1
    assert rt.store.row(run_id) is None
    up = rt.family(child.run_id)
    assert (up.parent_id, up.parent, up.parent_purged) == (run_id, None, True)
    # The child's settle has no parent to tell: it settles all the same.
    rt.cancel(child.run_id, by="ops")
    assert rt.get(child.run_id).status is RunStatus.CANCELLED


def test_race__a_parent_cancelled_just_before_its_child_is_stored(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent is cancelled after its segment's last fenced write and its cascade reads
    the children before the new child is stored: the starting segment sees the cancelled
    parent once the child is stored and cancels it, so no child of a cancelled parent runs."""
    create = rt.store.create

    def cancel_first(run: Run, **kw: Any) -> Run:
        if run.state.parent_id is not None:
            rt.cancel(run.state.parent_id, by="ops")  # its cascade finds no child yet
        return create(run, **kw)

    monkeypatch.setattr(rt.store, "create", cancel_first)
    run_id = rt.enqueue("parent", {})
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.CANCELLED
    (child,) = children_of(rt, run_id)
    assert child.status is RunStatus.CANCELLED
    cancelled = rt.history(child.run_id)[-1].event
    assert isinstance(cancelled, Run.Cancelled)
    assert cancelled.actor == f"parent:{run_id}"


def test_misuse__every_wrong_wait_is_refused_with_nothing_written(rt: Runtime) -> None:
    """An empty set, another run's child, a non-handle, a reserved name, a blank key, a
    negative timeout: each raises before any step, child or wait is written."""
    run_id = rt.enqueue("misuse", {})
    drain(rt, run_id)
    assert len(result_of(rt, run_id)["result"]) == 6
    assert children_of(rt, run_id) == []
    kinds = [h.event.kind for h in rt.history(run_id) if isinstance(h.event, Run.StepRecorded)]
    assert kinds == []
    assert "WaitStarted" not in [type(h.event).__name__ for h in rt.history(run_id)]


def test_kit__run_to_end_follows_children_of_sync_and_async_parents(rt: Runtime) -> None:
    kit = Kit(rt)
    assert kit.run_to_end("fanout", {"n": 4}).row.status is RunStatus.COMPLETED
    done = kit.run_to_end("async_fanout")
    assert done.row.status is RunStatus.COMPLETED
    assert result_of(rt, done.run_id) == {"result": [0, 1, 4]}


def test_console__the_run_page_links_parent_and_children(rt: Runtime) -> None:
    pytest.importorskip("starlette", reason="the console extra is not installed")
    from starlette.testclient import TestClient

    from steptrail.console import ConsoleConfig, create_app

    run_id = rt.enqueue("parent", {})
    rt.work(burst=True)
    rt.work(burst=True)
    (child,) = children_of(rt, run_id)
    console = create_app(rt, ConsoleConfig(project=False, operator="console:test"))
    web = TestClient(console, base_url="http://127.0.0.1:8765", follow_redirects=False)
    down = web.get(f"/runs/{run_id}").text
    assert "Child runs" in down
    assert f'href="/runs/{child.run_id}"' in down
    up = web.get(f"/runs/{child.run_id}").text
    assert f'href="/runs/{run_id}"' in up
    assert "Child runs" not in up


def test_concurrency_key__children_inherit_the_parents_key_unless_their_agent_has_one(
    rt: Runtime,
) -> None:
    """Issue 28: a child takes its parent's concurrency key and limit; a child whose agent
    names a key of its own keeps that one. With the tenant's limit of 1, the waiting
    parent holds no place, so its children run (one at a time) and it completes."""
    run_id = rt.enqueue("tenant_parent", {}, concurrency_key="tenant:acme")
    drain(rt, run_id)
    assert result_of(rt, run_id) == {"result": [0, 1, 4, "own"]}
    keys = sorted(
        (k.state.agent, k.state.concurrency_key, k.state.concurrency_limit)
        for k in children_of(rt, run_id)
    )
    assert keys == [
        ("own_key", "mailbox:ops", 1),
        ("square", "tenant:acme", 1),
        ("square", "tenant:acme", 1),
        ("square", "tenant:acme", 1),
    ]
    assert rt.verify_index() == []
