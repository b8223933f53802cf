"""Named queues and priorities (ADR 0077), on both backends: where a run goes, which worker
claims it, in which order, and that every writer of the run's row keeps them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from steptrail import App, RunContext
from steptrail.domain.classifier import ClassifiedError
from steptrail.domain.enums import FailureClass, RunStatus
from steptrail.domain.errors import IllegalTransition
from steptrail.domain.queues import PriorityChanged
from steptrail.runtime import InvalidItem, InvalidRequest, Runtime
from steptrail.workers.reaper import Reaper
from steptrail.workers.registry import UnknownQueue
from tests.conftest import logged_events, make_runtime

HOLDER = "worker:test"


def queued_app() -> App:
    app = App()

    @app.agent("light")
    def light(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {"n": request.get("n")}

    @app.agent("heavy", queue="heavy", priority=5)
    def heavy(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {"n": request.get("n")}

    @app.agent("fails")
    def fails(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        raise ClassifiedError(FailureClass.AUTH, "key revoked")

    @app.agent("blips")
    def blips(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        raise ClassifiedError(FailureClass.CONNECTION, "connection reset")

    @app.agent("naps", queue="bulk")
    def naps(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        # Long enough that a burst worker slowed by a busy machine is done before the
        # timer comes due (else it claims the woken run too, in the same burst).
        ctx.sleep(NAP_S)
        return {"got": ctx.wait_event("go")}

    app.queue("bulk")
    return app


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    runtime = make_runtime(db_url, app=queued_app())
    yield runtime
    runtime.close()


NAP_S = 0.3


def claim(rt: Runtime, *, limit: int = 16, queues: list[str] | None = None) -> list[Any]:
    return rt.store.claim_batch(
        holder=HOLDER,
        lease_ms=60_000,
        agents=rt.app.agent_names,
        limit=limit,
        queues=queues,
    )


def placed(rt: Runtime, run_id: UUID) -> tuple[str, int]:
    state = rt.get(run_id).state
    return state.queue, state.priority


def event_count(rt: Runtime) -> int:
    return logged_events(rt)


def test_enqueue__agent_defaults_and_explicit_placement(rt: Runtime) -> None:
    assert placed(rt, rt.enqueue("light")) == ("default", 0)
    assert placed(rt, rt.enqueue("heavy")) == ("heavy", 5)
    assert placed(rt, rt.enqueue("light", queue="bulk", priority=-3)) == ("bulk", -3)
    assert placed(rt, rt.enqueue("heavy", priority=0)) == ("heavy", 0)
    # The Queued event carries them: the log says where the run went.
    run_id = rt.enqueue("light", queue="heavy", priority=100)
    (queued, *_) = [h.event for h in rt.history(run_id)]
    assert (queued.queue, queued.priority) == ("heavy", 100)


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ({"queue": "nope"}, "unknown queue 'nope'"),
        ({"queue": ""}, "invalid queue name"),
        ({"queue": "Has Space"}, "invalid queue name"),
        ({"queue": "x" * 64}, "invalid queue name"),
        ({"priority": 101}, "invalid priority"),
        ({"priority": -101}, "invalid priority"),
        ({"priority": True}, "invalid priority"),
        ({"priority": "5"}, "invalid priority"),
    ],
)
def test_enqueue__bad_placement_is_refused_and_nothing_written(
    rt: Runtime, placement: dict[str, Any], message: str
) -> None:
    rt.enqueue("light")
    before = event_count(rt)
    with pytest.raises(InvalidRequest, match=message):
        rt.enqueue("light", {"n": 1}, **placement)
    with pytest.raises(InvalidItem, match=message) as caught:
        rt.enqueue_many([{"agent": "light"}, {"agent": "light", **placement}])
    assert caught.value.index == 1
    assert event_count(rt) == before
    assert len(rt.runs(limit=100)) == 1


def test_enqueue_many__items_name_their_queue_and_priority(rt: Runtime) -> None:
    ids = rt.enqueue_many(
        [
            {"agent": "light", "queue": "bulk", "priority": 7},
            {"agent": "heavy"},
            {"agent": "light"},
        ]
    )
    assert [placed(rt, i) for i in ids] == [("bulk", 7), ("heavy", 5), ("default", 0)]


def test_claim__only_the_queues_asked_for(rt: Runtime) -> None:
    light = [rt.enqueue("light", {"n": n}) for n in range(3)]
    heavy = [rt.enqueue("heavy", {"n": n}) for n in range(2)]
    bulk = rt.enqueue("light", queue="bulk")
    got = claim(rt, queues=["heavy"])
    assert {c.run.id for c in got} == set(heavy)
    assert claim(rt, queues=["heavy"]) == []  # never a default run
    got = claim(rt, queues=["bulk", "default"])
    assert {c.run.id for c in got} == {*light, bulk}


def test_claim__every_queue_by_default_highest_priority_first(rt: Runtime) -> None:
    low = rt.enqueue("light", priority=-1)
    zero = rt.enqueue("light")
    heavy = rt.enqueue("heavy")  # priority 5, queue heavy
    top = rt.enqueue("light", queue="bulk", priority=9)
    got = [c.run.id for c in claim(rt, limit=1)]
    got += [c.run.id for c in claim(rt, limit=3)]
    assert got[0] == top
    assert sorted(got[1:], key=lambda i: -rt.get(i).state.priority) == [heavy, zero, low]


def test_claim__a_priority_run_behind_a_thousand_is_in_the_first_batch(rt: Runtime) -> None:
    rt.enqueue_many([{"agent": "light", "request": {"n": n}} for n in range(1_000)])
    urgent = rt.enqueue("light", {"n": "urgent"}, priority=9)
    first = claim(rt, limit=4)
    assert urgent in [c.run.id for c in first]
    assert [c.run.state.priority for c in first].count(9) == 1


def test_work__a_worker_of_one_queue_runs_only_its_runs(rt: Runtime) -> None:
    light = rt.enqueue("light")
    heavy = rt.enqueue("heavy")
    report = rt.work(burst=True, queues=["heavy"])
    assert report.claimed == 1
    assert rt.get(heavy).status is RunStatus.COMPLETED
    assert rt.get(light).status is RunStatus.QUEUED
    # A worker of every queue (the default) takes the rest.
    assert rt.work(burst=True).claimed == 1
    assert rt.get(light).status is RunStatus.COMPLETED


def test_work__an_unknown_queue_is_refused_naming_the_known_ones(rt: Runtime) -> None:
    with pytest.raises(UnknownQueue, match=r"unknown queue 'nope' \(known: bulk, default, heavy\)"):
        rt.worker(queues=["heavy", "nope"])
    with pytest.raises(ValueError, match="invalid queue name"):
        rt.worker(queues=["Bad!"])
    with pytest.raises(ValueError, match="at least one queue"):
        rt.worker(queues=[])


def test_reclaimed_requeued_and_retried_runs_keep_queue_and_priority(rt: Runtime) -> None:
    # Reclaimed by the reaper after its holder went silent.
    stale = rt.enqueue("light", queue="bulk", priority=4)
    (held,) = rt.store.claim_batch(
        holder="worker:dead", lease_ms=30, agents=["light"], limit=1, queues=["bulk"]
    )
    assert held.run.id == stale
    time.sleep(0.1)
    Reaper(rt.store, rt.settings.retry_policy(), actor="reaper:test").reap_once()
    assert rt.get(stale).status is RunStatus.QUEUED
    assert placed(rt, stale) == ("bulk", 4)
    assert [c.run.id for c in claim(rt, queues=["bulk"])] == [stale]
    # Failed for good, then retried by an operator.
    failed = rt.enqueue("fails", queue="heavy", priority=-7)
    rt.work(burst=True, queues=["heavy"])
    assert rt.get(failed).status is RunStatus.FAILED
    rt.retry(failed, by="ops")
    assert rt.get(failed).status is RunStatus.QUEUED
    assert placed(rt, failed) == ("heavy", -7)
    (again,) = claim(rt, queues=["heavy"])
    assert again.run.id == failed
    assert (again.run.state.queue, again.run.state.priority) == ("heavy", -7)
    # Requeued with a backoff after a transient failure.
    blip = rt.enqueue("blips", queue="bulk", priority=2)
    (taken,) = claim(rt, queues=["bulk"])
    assert taken.run.id == blip
    rt.executor().execute(taken.run, {}, resumable=None)
    assert rt.get(blip).status is RunStatus.QUEUED
    assert rt.get(blip).state.requeue_count == 1
    assert placed(rt, blip) == ("bulk", 2)
    # The live rows equal their rebuild from the log.
    assert rt.verify_index() == []


def test_set_priority__reorders_the_queue_and_is_in_the_trail(rt: Runtime) -> None:
    first = rt.enqueue("light", {"n": 1})
    second = rt.enqueue("light", {"n": 2})
    row = rt.set_priority(second, 3, by="ops")
    assert row.state.priority == 3
    assert row.status is RunStatus.QUEUED
    (change,) = [h.event for h in rt.history(second) if isinstance(h.event, PriorityChanged)]
    assert (change.priority, change.previous, change.actor) == (3, 0, "ops")
    assert [c.run.id for c in claim(rt, limit=1)] == [second]
    assert [c.run.id for c in claim(rt, limit=1)] == [first]
    assert rt.verify_index() == []


def test_set_priority__the_same_priority_writes_nothing(rt: Runtime) -> None:
    run_id = rt.enqueue("heavy")
    before = event_count(rt)
    assert rt.set_priority(run_id, 5).state.priority == 5
    assert event_count(rt) == before


def test_set_priority__refused_for_a_held_or_settled_run_or_a_bad_value(rt: Runtime) -> None:
    done = rt.enqueue("light")
    rt.work(burst=True)
    held = rt.enqueue("light")
    claim(rt)
    waiting = rt.enqueue("light")
    before = event_count(rt)
    with pytest.raises(IllegalTransition, match="completed"):
        rt.set_priority(done, 1)
    with pytest.raises(IllegalTransition, match="running"):
        rt.set_priority(held, 1)
    for bad in (101, -101, True, 2.5):
        with pytest.raises(InvalidRequest, match="invalid priority"):
            rt.set_priority(waiting, bad)  # type: ignore[arg-type]
    assert event_count(rt) == before


def test_runs__narrowed_to_a_queue_and_a_lowest_priority_across_pages(rt: Runtime) -> None:
    heavy = [rt.enqueue("heavy", {"n": n}) for n in range(3)]
    rt.enqueue_many([{"agent": "light", "request": {"n": n}} for n in range(450)])
    urgent = rt.enqueue("light", priority=9)
    listed = rt.runs(queue="heavy", limit=10)
    assert [r.run_id for r in listed] == heavy[::-1]  # newest first, behind 451 others
    assert [r.run_id for r in rt.runs(min_priority=5, limit=10)] == [urgent, *heavy[::-1]]
    assert [r.run_id for r in rt.runs(min_priority=6, status="queued", limit=10)] == [urgent]
    assert [r.run_id for r in rt.runs(queue="heavy", limit=2)] == heavy[:0:-1]
    assert rt.runs(queue="bulk", limit=10) == []


def test_verify_and_rebuild__the_columns_are_the_log_s(rt: Runtime) -> None:
    """A queue or priority changed by hand is drift `verify` reports, and the rebuild of
    the index gives back what the log says (Queued, then PriorityChanged)."""
    from tests.integration.test_maintenance_ranges import _sql

    moved = rt.enqueue("heavy")
    bumped = rt.enqueue("light", queue="bulk")
    rt.set_priority(bumped, -4)
    _sql(rt.store, "UPDATE steptrail_runs SET queue = 'default' WHERE run_id = {id}", moved)
    _sql(rt.store, "UPDATE steptrail_runs SET priority = 0 WHERE run_id = {id}", bumped)
    problems = rt.verify_index()
    assert len(problems) == 2
    assert all("!=" in p for p in problems)
    rt.store.rebuild_index()
    assert rt.verify_index() == []
    assert placed(rt, moved) == ("heavy", 5)
    assert placed(rt, bumped) == ("bulk", -4)
    assert [c.run.id for c in claim(rt, queues=["heavy"])] == [moved]


def test_woken_runs_keep_queue_and_priority(rt: Runtime) -> None:
    """A run woken by its timer (the claim at its deadline) and by a signal (Woken) is
    claimed from its own queue at its own priority, changed while it slept."""
    run_id = rt.enqueue("naps", priority=3)
    assert rt.work(burst=True, queues=["bulk"]).claimed == 1
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_TIMER
    rt.set_priority(run_id, 6, by="ops")  # a waiting run's priority may change
    time.sleep(NAP_S + 0.05)
    assert claim(rt, queues=["default", "heavy"]) == []
    (woke,) = claim(rt, queues=["bulk"])
    assert (woke.run.id, woke.run.state.queue, woke.run.state.priority) == (run_id, "bulk", 6)
    rt.executor().execute(woke.run, {}, resumable=None)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_EVENT
    rt.signal(run_id, "go", {"ok": True})
    assert rt.get(run_id).status is RunStatus.QUEUED
    assert placed(rt, run_id) == ("bulk", 6)
    assert claim(rt, queues=["default"]) == []
    assert [c.run.id for c in claim(rt, queues=["bulk"])] == [run_id]
    assert rt.verify_index() == []


def _moved_after_read(rt: Runtime, monkeypatch: pytest.MonkeyPatch, move: Any) -> None:
    """The first `load` of the run returns what it read, then `move` changes the run (a
    writer slipping in between the operator's read and append)."""
    real = rt.store.load
    moved: list[bool] = []

    def load(run_id: UUID) -> Any:
        run = real(run_id)
        if not moved:
            moved.append(True)
            move()
        return run

    monkeypatch.setattr(rt.store, "load", load)


def test_set_priority__a_claim_in_between_wins_and_nothing_is_written(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = rt.enqueue("light")
    _moved_after_read(rt, monkeypatch, lambda: claim(rt))
    with pytest.raises(IllegalTransition, match="running"):
        rt.set_priority(run_id, 5)
    assert not [h for h in rt.history(run_id) if isinstance(h.event, PriorityChanged)]
    assert rt.get(run_id).state.priority == 0


def test_set_priority__a_wake_up_in_between_is_retried_on_the_queued_run(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = rt.enqueue("naps")
    rt.work(burst=True)
    time.sleep(NAP_S + 0.05)
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_EVENT
    _moved_after_read(rt, monkeypatch, lambda: rt.signal(run_id, "go", {"n": 1}))
    row = rt.set_priority(run_id, 7, by="ops")  # fenced off once, then lands on the queued run
    assert (row.status, row.state.priority) == (RunStatus.QUEUED, 7)
    trail = [type(h.event).__name__ for h in rt.history(run_id)]
    assert trail[-2:] == ["Woken", "PriorityChanged"]
