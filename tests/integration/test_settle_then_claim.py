"""A settle that claims the worker's next run in the same write (ADR 0058), end to end:
it is used, it counts as the worker's claim, it stops with the worker, a lost reply to it
costs a reaped run and nothing else, and a claimed async run goes to the event loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from steptrail import App, RunContext
from steptrail.domain.enums import RunStatus
from steptrail.domain.errors import StoreUnavailable
from steptrail.domain.ports import ClaimedRun, ClaimRequest
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
from tests.conftest import make_runtime


class Watched:
    """The real store, counting the dispatcher's claims and the settles that claimed, and
    able to lose the reply to the next settle that claims (it lands, the caller sees an
    error)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.claims = 0
        self.chained: list[UUID] = []
        self.lose_next_chained_reply = False
        self.lost: list[ClaimedRun] = []

    def claim_batch(self, **kwargs: Any) -> list[ClaimedRun]:
        self.claims += 1
        return self.inner.claim_batch(**kwargs)  # type: ignore[no-any-return]

    def append(
        self, run: Run, *, resumable: bytes | None = None, then_claim: ClaimRequest | None = None
    ) -> list[ClaimedRun]:
        claimed: list[ClaimedRun] = self.inner.append(
            run, resumable=resumable, then_claim=then_claim
        )
        if then_claim is not None:
            self.chained += [c.run.id for c in claimed]
            if self.lose_next_chained_reply and claimed:
                self.lose_next_chained_reply = False
                self.lost += claimed
                raise StoreUnavailable("server closed the connection unexpectedly")
        return claimed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def watched(rt: Runtime) -> Watched:
    store = Watched(rt.store)
    rt.store = store  # type: ignore[assignment]
    return store


def events_of(rt: Runtime, run_id: UUID) -> list[str]:
    return [type(h.event).__name__ for h in rt.history(run_id)]


def test_chain__a_stream_of_runs_is_claimed_by_the_settles(runtime: Runtime) -> None:
    """One slot, ten queued runs: the dispatcher claims the first and finds the queue empty
    at the end; every other run was claimed by the settle before it, under the worker's own
    name, and counted as claimed."""
    store = watched(runtime)
    ids = [runtime.enqueue("scripted", {"steps": 2}) for _ in range(10)]
    report = runtime.work(concurrency=1, burst=True)
    assert report.outcomes["completed"] == 10
    assert report.claimed == 10
    assert store.claims == 2  # the first run, then the empty queue
    assert store.chained == ids[1:]
    for run_id in ids:
        assert events_of(runtime, run_id) == [
            "Queued",
            "Claimed",
            "StepRecorded",
            "StepRecorded",
            "Completed",
        ]
        claims = [h.event for h in runtime.history(run_id) if isinstance(h.event, Run.Claimed)]
        assert [c.actor for c in claims] == [report.holder]


def test_chain__only_a_worker_of_one_slot_chains(runtime: Runtime) -> None:
    """With more slots the dispatcher claims for every slot (several at once when several
    free up), and no settle claims: a claim per settle would cost the server more than the
    round trips it saves (ADR 0058)."""
    store = watched(runtime)
    for _ in range(6):
        runtime.enqueue("scripted", {"steps": 1})
    report = runtime.work(concurrency=2, burst=True)
    assert report.outcomes["completed"] == 6
    assert store.chained == []
    assert store.claims >= 2


def test_chain__a_stopping_worker_claims_nothing_more(db_url: str) -> None:
    """Once the worker is asked to stop, the run in flight settles without claiming: the
    runs behind it stay queued, untouched, for another worker."""
    app = App()
    stop: list[Callable[[], None]] = []

    @app.agent("stopper")
    def stopper(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("step", lambda: "ok")
        stop[0]()
        return {}

    rt = make_runtime(db_url, app=app)
    try:
        ids = [rt.enqueue("stopper", {}) for _ in range(3)]
        worker = rt.worker(concurrency=1)
        stop.append(worker.stop)
        thread = threading.Thread(target=worker.run)
        thread.start()
        thread.join(20)
        assert not thread.is_alive()
        assert worker.report.outcomes["completed"] == 1
        assert rt.get(ids[0]).status is RunStatus.COMPLETED
        for run_id in ids[1:]:
            assert events_of(rt, run_id) == ["Queued"]
    finally:
        rt.close()


def test_chain__lost_reply_to_a_claiming_settle_costs_a_reap_only(db_url: str) -> None:
    """The reply to a settle that claimed is lost. The segment finds its settle landed (its
    run completes); the run the settle claimed is not known to the worker, so it stays
    leased to it until the lease runs out, the reaper puts it back, and it completes: no
    run lost, none run twice at once, and the retried settle claimed nothing."""
    rt = make_runtime(db_url, lease_seconds=1.0)
    try:
        store = watched(rt)
        store.lose_next_chained_reply = True
        first, second = rt.enqueue("scripted", {"steps": 1}), rt.enqueue("scripted", {"steps": 1})
        report = rt.work(concurrency=1, burst=True)
        assert report.outcomes["completed"] == 1
        assert rt.get(first).status is RunStatus.COMPLETED
        assert [c.run.id for c in store.lost] == [second]
        orphan = rt.get(second)
        assert orphan.status is RunStatus.RUNNING
        assert orphan.state.holder == report.holder
        assert store.chained == [second]  # claimed once, by the settle whose reply was lost

        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not rt.reap().requeued:
            time.sleep(0.1)
        assert rt.work(concurrency=1, burst=True).outcomes["completed"] == 1
        assert events_of(rt, second) == [
            "Queued",
            "Claimed",
            "Reclaimed",
            "Claimed",
            "StepRecorded",
            "Completed",
        ]
        assert rt.verify() == []
    finally:
        rt.close()


def test_chain__a_claimed_async_run_goes_to_the_event_loop(db_url: str) -> None:
    """A synchronous run's settle claims an async agent's run: it runs on the worker's event
    loop with the slot it inherited, and the worker finishes both."""
    app = App()

    @app.agent("sync_one")
    def sync_one(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {"n": ctx.llm("step", lambda: 1)}

    @app.agent("async_one")
    async def async_one(ctx: Any, request: dict[str, Any]) -> dict[str, Any]:
        return {"n": await ctx.llm("step", _two)}

    rt = make_runtime(db_url, app=app)
    try:
        store = watched(rt)
        first, second = rt.enqueue("sync_one", {}), rt.enqueue("async_one", {})
        report = rt.work(concurrency=1, burst=True)
        assert report.outcomes["completed"] == 2
        assert store.chained == [second]
        assert rt.get(first).status is RunStatus.COMPLETED
        assert rt.get(second).status is RunStatus.COMPLETED
        assert events_of(rt, second) == ["Queued", "Claimed", "StepRecorded", "Completed"]
    finally:
        rt.close()


async def _two() -> int:
    return 2
