"""An idle worker waits until the earliest due time among the runs it may claim, not a fixed
poll (ADR 0082), on both backends.

The worker's waits are made deterministic: its store is wrapped so that `wait_for_work`
records how long the worker asked to wait and moves the store's clock that far forward
(SQLite's offset, or the testing kit's skippable PostgreSQL clock) instead of sleeping. So
"the sleeper was claimed before the poll would have fired" is read off the store's clock
in the run's own log, whatever the machine's speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from steptrail import App, RunContext
from steptrail.domain.enums import RunStatus
from steptrail.domain.idle import DUE_MARGIN_S, MIN_WAIT_S
from steptrail.domain.run import Run
from steptrail.domain.waits import WaitStarted
from steptrail.runtime import Runtime
from steptrail.testing import Kit
from steptrail.testing.pgclock import fresh_database
from steptrail.workers.execute import SegmentResult
from tests.conftest import PG_ADMIN_URL, make_runtime

POLL_S = 30.0  # far longer than any sleep below: a worker that polls is caught at once


def sleepers_app() -> App:
    app = App()
    app.queue("urgent")

    @app.agent("sleeper")
    def sleeper(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("before", lambda: "awake")
        ctx.sleep(request["seconds"])
        ctx.llm("after", lambda: "awake again")
        return {"slept": request["seconds"]}

    @app.agent("quick")
    def quick(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("only", lambda: "done")
        return {}

    @app.agent("other")
    def other(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.sleep(request["seconds"])
        return {}

    @app.agent("until")
    def until(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.sleep_until(datetime.fromisoformat(request["at"]))
        return {}

    # Keyed (ADR 0078): its runs are claimed through the keys, their wake-ups seen by the
    # keyed due index (ADR 0087).
    @app.agent("keyed", concurrency_limit=1)
    def keyed(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("before", lambda: "awake")
        ctx.sleep(request["seconds"])
        ctx.llm("after", lambda: "awake again")
        return {"slept": request["seconds"]}

    return app


@pytest.fixture
def rt(backend: str, tmp_path: Path) -> Iterator[Runtime]:
    """A runtime whose store's clock the kit can skip: SQLite always; PostgreSQL in a
    database made with the kit's clock installed."""
    settings = {"poll_interval": POLL_S, "lease_seconds": 30.0}
    if backend == "sqlite":
        runtime = make_runtime(f"sqlite:///{tmp_path / 'wake.db'}", sleepers_app(), **settings)
        try:
            yield runtime
        finally:
            runtime.close()
        return
    with fresh_database(PG_ADMIN_URL, prefix="steptrail_wake") as url:
        runtime = make_runtime(url, sleepers_app(), **settings)
        try:
            yield runtime
        finally:
            runtime.close()


class SkippingWaits:
    """The store, except that a wait of a worker with no run in flight (every run asleep)
    moves the store's clock forward by the wait asked for and returns at once; each such
    wait is kept. With a run in flight the wait is the store's own, which the run's end
    wakes (time must not jump under a segment that holds a lease)."""

    def __init__(self, store: Any, kit: Kit) -> None:
        self._store = store
        self._kit = kit
        self.waits: list[float] = []
        self.finished = threading.Event()
        self.worker: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def wait_for_work(self, timeout: float) -> bool:
        with self.worker._slot_freed:
            busy = self.worker._in_flight > 0
        if busy or self.finished.is_set():
            return bool(self._store.wait_for_work(min(timeout, 1.0)))
        if self._store._woken.is_set():  # woken before the wait (a segment ended): returns
            return bool(self._store.wait_for_work(0))
        self.waits.append(timeout)
        self._kit.skip(timeout)
        return False  # the whole wait passed


def drain(rt: Runtime, run_ids: list[Any]) -> SkippingWaits:
    """Run a worker (poll POLL_S) over `rt` with skipping waits until every run of
    `run_ids` has completed; its store wrapper, with the waits it asked for."""
    kit = Kit(rt)
    store = SkippingWaits(rt.store, kit)
    done: set[Any] = set()
    worker_box: list[Any] = []

    def on_result(result: SegmentResult) -> None:
        if rt.store.load(result.run_id).status is RunStatus.COMPLETED:  # type: ignore[union-attr]
            done.add(result.run_id)
        if done >= set(run_ids):
            store.finished.set()
            worker_box[0].stop()

    worker = rt.worker(concurrency=2, on_result=on_result)
    worker.store = store  # type: ignore[assignment]
    store.worker = worker
    worker_box.append(worker)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the worker never finished the sleepers"
    return store


def woke_at_and_claimed_again(rt: Runtime, run_id: Any) -> tuple[datetime, datetime]:
    """When the run's sleep was due, and when a worker claimed it after the sleep, both by
    the store's clock (the log's recorded_at)."""
    history = rt.store.history(run_id)
    started = next(h for h in history if isinstance(h.event, WaitStarted))
    assert started.event.timeout_ms is not None
    due = started.recorded_at + timedelta(milliseconds=started.event.timeout_ms)
    claimed = next(
        h for h in history if h.version > started.version and isinstance(h.event, Run.Claimed)
    )
    return due, claimed.recorded_at


def test_idle_worker__claims_a_sleeper_when_due_not_at_the_poll(rt: Runtime) -> None:
    """With a 30 s poll, a run sleeping 1 s is claimed again within a second of its due time
    by the store's clock, and the worker never asked to wait as long as its poll."""
    run_id = rt.enqueue("sleeper", {"seconds": 1})
    store = drain(rt, [run_id])
    assert rt.get(run_id).status is RunStatus.COMPLETED
    due, claimed = woke_at_and_claimed_again(rt, run_id)
    assert due <= claimed < due + timedelta(seconds=1)
    assert store.waits
    assert max(store.waits) < POLL_S
    assert sum(store.waits) < 1 + 2 * DUE_MARGIN_S + len(store.waits) * MIN_WAIT_S


def test_idle_worker__sleepers_wake_in_due_order_each_at_its_time(rt: Runtime) -> None:
    """Three sleepers of 3 s, 1 s and 2 s: claimed again in the order of their due times,
    each within a second of it, with a 30 s poll."""
    ids = {s: rt.enqueue("sleeper", {"seconds": s}) for s in (3, 1, 2)}
    drain(rt, list(ids.values()))
    claims = {s: woke_at_and_claimed_again(rt, run_id) for s, run_id in ids.items()}
    for due, claimed in claims.values():
        assert due <= claimed < due + timedelta(seconds=1)
    assert sorted(claims, key=lambda s: claims[s][1]) == [1, 2, 3]


def test_next_due_in__earliest_due_time_over_queues_and_levels(rt: Runtime) -> None:
    """`next_due_in` is the time to the earliest due run of the agents and queues asked
    for, whichever queue and priority level holds it; None when none has one."""
    store: Any = rt.store
    before = rt.store.store_now()
    rt.enqueue("sleeper", {"seconds": 300}, queue="urgent", priority=5)
    rt.enqueue("sleeper", {"seconds": 100})  # default queue, priority 0: the earliest
    rt.enqueue("other", {"seconds": 50})
    rt.worker(concurrency=4, burst=True).run()  # each runs to its sleep and suspends
    assert {r.state.status for r in store.all_rows()} == {RunStatus.WAITING_FOR_TIMER}
    due_in = store.next_due_in(agents=["sleeper"])
    urgent = store.next_due_in(agents=["sleeper"], queues=["urgent"])
    both = store.next_due_in(agents=["sleeper", "other"])
    elapsed = (rt.store.store_now() - before).total_seconds()  # after every answer
    assert 100 - elapsed <= due_in <= 100
    assert 300 - elapsed <= urgent <= 300
    assert 50 - elapsed <= both <= 50
    assert store.next_due_in(agents=["nobody"]) is None
    assert store.next_due_in(agents=["sleeper"], queues=["nowhere"]) is None


def test_next_due_in__a_queued_run_is_due_now(rt: Runtime) -> None:
    """A run queued and not claimed is due already: the answer is at most zero, so an idle
    worker claims again almost at once."""
    rt.enqueue("sleeper", {"seconds": 1})
    store: Any = rt.store
    due_in = store.next_due_in(agents=["sleeper"])
    assert due_in is not None
    assert due_in <= 0


def wait_until(condition: Callable[[], bool]) -> None:
    """Return once `condition` holds (checked every 10 ms, for at most 30 s)."""
    for _ in range(3000):
        if condition():
            return
        time.sleep(0.01)


class CountingReads:
    """The store, counting `next_due_in` reads; its waits are the store's own."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def next_due_in(self, **kwargs: Any) -> float | None:
        self.reads += 1
        return self._store.next_due_in(**kwargs)  # type: ignore[no-any-return]


def test_idle_worker__reads_the_due_time_again_only_when_it_may_have_moved(rt: Runtime) -> None:
    """Runs that settle, each waking the worker by its enqueue, cost no due-time read (the
    first idle wait's read stands); a run that goes to sleep makes the next wait read it."""
    store = CountingReads(rt.store)
    settled = threading.Semaphore(0)
    worker = rt.worker(concurrency=2, on_result=lambda result: settled.release())
    worker.store = store  # type: ignore[assignment]
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: store.reads == 1)  # idle, nothing due: the first wait's read
        for _ in range(5):
            run_id = rt.enqueue("quick", {})
            assert settled.acquire(timeout=30)
            assert rt.get(run_id).status is RunStatus.COMPLETED
        reads_after_settled_runs = store.reads
        rt.enqueue("other", {"seconds": 3600})  # suspends: its wake-up is a new due time
        assert settled.acquire(timeout=30)
        wait_until(lambda: store.reads > reads_after_settled_runs)  # on its way to its wait
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert reads_after_settled_runs == 1
    assert store.reads == reads_after_settled_runs + 1


def test_worker__pauses_after_a_partial_claim_instead_of_claiming_per_run(db_url: str) -> None:
    """Sleepers coming due a millisecond apart, with slots to spare: after a claim that took
    all it saw due, the dispatcher pauses (ADR 0089) instead of claiming again at once, so
    the wake-ups are claimed a handful at a time, not one claim (or more) per run; each is
    still claimed within a few milliseconds of its due time."""
    runtime = make_runtime(db_url, sleepers_app(), poll_interval=1.0, lease_seconds=30.0)
    try:
        count = 40
        base = datetime.now(UTC) + timedelta(seconds=1.5)  # all asleep before the first is due
        ids = [
            runtime.enqueue("until", {"at": (base + timedelta(milliseconds=i)).isoformat()})
            for i in range(count)
        ]
        runtime.work(burst=True)
        assert all(runtime.get(i).status is RunStatus.WAITING_FOR_TIMER for i in ids)
        claims: list[int] = []
        store: Any = runtime.store
        real = store.claim_batch

        def counting(**kwargs: Any) -> Any:
            got = real(**kwargs)
            claims.append(len(got))
            return got

        store.claim_batch = counting
        worker = runtime.worker(concurrency=count)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
            runtime.get(i).status is RunStatus.COMPLETED for i in ids
        ):
            time.sleep(0.05)
        worker.stop()
        thread.join(timeout=30)
        del store.claim_batch
        assert all(runtime.get(i).status is RunStatus.COMPLETED for i in ids)
        taken = [n for n in claims if n]
        assert sum(taken) == count
        # Without the pause: about one claim per run (40), most of one run, with empty ones
        # between. With it, at most one claim per 5 ms of the 40 ms the due times span,
        # plus the few a slow machine adds.
        assert len(taken) <= 20, claims
    finally:
        runtime.close()


# -- Keyed runs (ADR 0087) ---------------------------------------------------------------------


def test_idle_worker__claims_a_keyed_sleeper_when_due_not_at_the_poll(rt: Runtime) -> None:
    """With a 30 s poll, a run under a concurrency key sleeping 1 s is claimed again within a
    second of its due time by the store's clock, as a run without a key is (ADR 0087)."""
    run_id = rt.enqueue("keyed", {"seconds": 1}, concurrency_key="tenant:a")
    store = drain(rt, [run_id])
    assert rt.get(run_id).status is RunStatus.COMPLETED
    due, claimed = woke_at_and_claimed_again(rt, run_id)
    assert due <= claimed < due + timedelta(seconds=1)
    assert store.waits
    assert max(store.waits) < POLL_S
    assert sum(store.waits) < 1 + 2 * DUE_MARGIN_S + len(store.waits) * MIN_WAIT_S


def test_idle_worker__keyed_and_plain_sleepers_wake_in_due_order(rt: Runtime) -> None:
    """Keyed sleepers of 3 s and 1 s on two keys and a plain one of 2 s: each claimed again
    within a second of its due time, in due order, with a 30 s poll."""
    ids = {
        3: rt.enqueue("keyed", {"seconds": 3}, concurrency_key="tenant:a"),
        1: rt.enqueue("keyed", {"seconds": 1}, concurrency_key="tenant:b"),
        2: rt.enqueue("sleeper", {"seconds": 2}),
    }
    drain(rt, list(ids.values()))
    claims = {s: woke_at_and_claimed_again(rt, run_id) for s, run_id in ids.items()}
    for due, claimed in claims.values():
        assert due <= claimed < due + timedelta(seconds=1)
    assert sorted(claims, key=lambda s: claims[s][1]) == [1, 2, 3]


def asleep(rt: Runtime) -> None:
    """Run every queued run to its sleep; all of them suspend."""
    rt.worker(concurrency=4, burst=True).run()
    store: Any = rt.store
    assert {r.state.status for r in store.all_rows()} == {RunStatus.WAITING_FOR_TIMER}


def take_the_place(rt: Runtime, key: str) -> Any:
    """A run of `key` claimed by a peer that keeps it (its key's one place is taken); its id."""
    run_id = rt.enqueue("keyed", {"seconds": 1}, concurrency_key=key)
    claimed = rt.store.claim_batch(
        holder="worker:peer", lease_ms=600_000, agents=["keyed"], limit=1
    )
    assert [c.run.id for c in claimed] == [run_id]
    return run_id


def test_next_due_in__keyed_due_times_count_unless_held_back(rt: Runtime) -> None:
    """A keyed sleeper's due time counts, on its key or in its queue; once passed it counts
    (at most zero) while its key has a free place, and a run held back by its key's limit
    does not count at all: the answer is then the next due time to come, or None. A keyed
    run just enqueued is not counted (its enqueue wakes the workers)."""
    store: Any = rt.store
    before = rt.store.store_now()
    rt.enqueue("keyed", {"seconds": 300}, concurrency_key="tenant:a", queue="urgent")
    rt.enqueue("keyed", {"seconds": 100}, concurrency_key="tenant:b")
    asleep(rt)
    due_in = store.next_due_in(agents=["keyed"])
    urgent = store.next_due_in(agents=["keyed"], queues=["urgent"])
    plain_only = store.next_due_in(agents=["sleeper"])
    elapsed = (rt.store.store_now() - before).total_seconds()
    assert 100 - elapsed <= due_in <= 100
    assert 300 - elapsed <= urgent <= 300
    assert plain_only is None
    # tenant:c's place taken by a peer, a second run of it due and held back: not counted.
    take_the_place(rt, "tenant:c")
    rt.enqueue("keyed", {"seconds": 1}, concurrency_key="tenant:c")
    assert rt.store.held_back(agents=["keyed"])
    assert 0 < store.next_due_in(agents=["keyed"]) <= 100
    assert store.next_due_in(agents=["keyed"], queues=["nowhere"]) is None
    rt.enqueue("keyed", {"seconds": 1}, concurrency_key="tenant:d")  # free key, not counted
    assert 0 < store.next_due_in(agents=["keyed"]) <= 100
    # tenant:b's sleeper due by the store's clock, its key's place free: claimable at once.
    Kit(rt).skip(150)
    ready = store.next_due_in(agents=["keyed"])
    assert ready is not None
    assert -150 <= ready <= 0


def test_next_due_in__only_held_back_keyed_runs_is_none(rt: Runtime) -> None:
    """Every keyed run due is held back by its key's limit: nothing is due for this worker."""
    store: Any = rt.store
    take_the_place(rt, "tenant:a")
    for _ in range(3):
        rt.enqueue("keyed", {"seconds": 1}, concurrency_key="tenant:a")
    assert rt.store.held_back(agents=["keyed"])
    assert store.next_due_in(agents=["keyed"]) is None


class CountingClaims:
    """The store, counting claims and keeping each idle wait asked for; its waits are the
    store's own, real ones."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.claims = 0
        self.waits: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def claim_batch(self, **kwargs: Any) -> Any:
        self.claims += 1
        return self._store.claim_batch(**kwargs)

    def wait_for_work(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return bool(self._store.wait_for_work(timeout))


def test_idle_worker__a_held_back_keyed_run_does_not_make_it_spin(rt: Runtime) -> None:
    """A keyed sleeper whose key's one place a peer holds, and a due run of that key behind
    it: the idle worker wakes at the sleeper's due time (the place may have freed), finds
    nothing to claim, and then waits its whole poll: a handful of claims in two seconds,
    not one every few milliseconds (ADR 0087)."""
    sleeper = rt.enqueue("keyed", {"seconds": 1}, concurrency_key="tenant:a")
    asleep(rt)
    take_the_place(rt, "tenant:a")
    held = rt.enqueue("keyed", {"seconds": 1}, concurrency_key="tenant:a")
    store = CountingClaims(rt.store)
    worker = rt.worker(concurrency=2)
    worker.store = store  # type: ignore[assignment]
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        time.sleep(2.0)  # the sleeper came due a second ago
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert worker.report.claimed == 0
    assert {rt.get(sleeper).status, rt.get(held).status} == {
        RunStatus.WAITING_FOR_TIMER,
        RunStatus.QUEUED,
    }
    assert 2 <= store.claims <= 4, store.waits
    assert store.waits[0] < 1.5  # until the sleeper's due time, not the poll
    assert store.waits[-1] == POLL_S  # then the poll: nothing it may claim has a due time
