"""Concurrency limits per key (ADR 0078), on both backends: where a run's key and limit
come from, that the claim never lets more runs of a key run than its limit (with claimers
racing), that keys are served round-robin, and that a suspended or reclaimed run frees its
place."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from steptrail import App, RunContext
from steptrail.async_runtime import AsyncRuntime
from steptrail.domain.enums import RunStatus
from steptrail.runtime import InvalidItem, InvalidRequest, Runtime
from steptrail.workers.reaper import Reaper
from tests.conftest import logged_events, make_runtime


def keyed_app() -> App:
    app = App()

    @app.agent("task")
    def task(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {"n": request.get("n")}

    @app.agent("mail", concurrency_key="mailbox:ops", concurrency_limit=1)
    def mail(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {}

    @app.agent("waits")
    def waits(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {"got": ctx.wait_event("go")}

    @app.agent("later", queue="bulk", concurrency_limit=4)
    def later(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {}

    app.limit("tenant:*", 2)
    app.limit("tenant:big*", 3)
    app.limit("tenant:vip", 5)
    app.limit("solo", 1)
    return app


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    runtime = make_runtime(db_url, app=keyed_app())
    yield runtime
    runtime.close()


def claim(
    rt: Runtime, *, limit: int = 16, holder: str = "worker:test", lease_ms: int = 60_000
) -> list[Any]:
    return rt.store.claim_batch(
        holder=holder, lease_ms=lease_ms, agents=rt.app.agent_names, limit=limit
    )


def keyed(rt: Runtime, run_id: UUID) -> tuple[str | None, int | None]:
    state = rt.get(run_id).state
    return state.concurrency_key, state.concurrency_limit


def running_by_key(rt: Runtime) -> Counter[str | None]:
    rows = rt.store.list_rows(status="running", agent=None, reason=None, limit=10_000)
    return Counter(r.state.concurrency_key for r in rows)


def key_table(rt: Runtime) -> dict[str, tuple[int, int]]:
    """steptrail_concurrency_keys as (running, pending) per key with any, and the same
    recounted from the run index: the triggers must keep them equal."""
    kept = "SELECT key AS k, running AS r, pending AS p FROM steptrail_concurrency_keys"
    recount = (
        "SELECT concurrency_key AS k, sum(CASE WHEN status = 'running' THEN 1 ELSE 0 END) AS r,"
        " sum(CASE WHEN available_at IS NOT NULL THEN 1 ELSE 0 END) AS p FROM steptrail_runs"
        " WHERE concurrency_key IS NOT NULL GROUP BY concurrency_key"
    )
    store: Any = rt.store
    if store.backend == "sqlite":
        with store._read() as cur:
            a, b = cur.execute(kept).fetchall(), cur.execute(recount).fetchall()
    else:
        with store._connection() as conn:
            a, b = conn.execute(kept).fetchall(), conn.execute(recount).fetchall()
    table = {r["k"]: (int(r["r"]), int(r["p"])) for r in a if (r["r"], r["p"]) != (0, 0)}
    assert table == {r["k"]: (int(r["r"]), int(r["p"])) for r in b if (r["r"], r["p"]) != (0, 0)}
    return table


def event_count(rt: Runtime) -> int:
    return logged_events(rt)


def test_enqueue__the_most_specific_pattern_gives_the_limit(rt: Runtime) -> None:
    assert keyed(rt, rt.enqueue("task")) == (None, None)
    assert keyed(rt, rt.enqueue("task", concurrency_key="tenant:acme")) == ("tenant:acme", 2)
    assert keyed(rt, rt.enqueue("task", concurrency_key="tenant:bigco")) == ("tenant:bigco", 3)
    assert keyed(rt, rt.enqueue("task", concurrency_key="tenant:vip")) == ("tenant:vip", 5)
    # The agent's key and limit are its runs' defaults; App.limit patterns win over the
    # agent's limit, which covers keys no pattern matches.
    assert keyed(rt, rt.enqueue("mail")) == ("mailbox:ops", 1)
    assert keyed(rt, rt.enqueue("mail", concurrency_key="tenant:x")) == ("tenant:x", 2)
    assert keyed(rt, rt.enqueue("later", concurrency_key="batch:7")) == ("batch:7", 4)
    # The key travels in the Queued event: the state folded from the log has it.
    run_id = rt.enqueue("task", concurrency_key="solo")
    assert rt.store.load(run_id).state.concurrency_key == "solo"  # type: ignore[union-attr]
    row = rt.store.row(run_id)
    assert row is not None
    assert (row.state.concurrency_key, row.state.concurrency_limit) == ("solo", 1)


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "invalid concurrency key"),
        ("tenant:*", "invalid concurrency key"),
        (" tenant", "invalid concurrency key"),
        ("x" * 129, "invalid concurrency key"),
        (7, "invalid concurrency key"),
        ("nolimit:1", "no concurrency limit for key 'nolimit:1'"),
    ],
)
def test_enqueue__bad_keys_are_refused_and_nothing_is_written(
    rt: Runtime, key: Any, why: str
) -> None:
    before = event_count(rt)
    with pytest.raises(InvalidRequest, match=why):
        rt.enqueue("task", concurrency_key=key)
    with pytest.raises(InvalidItem, match=why):
        rt.enqueue_many(
            [
                {"agent": "task", "concurrency_key": "tenant:a"},
                {"agent": "task", "concurrency_key": key},
            ]
        )
    assert event_count(rt) == before
    assert rt.store.list_rows(status=None, agent=None, reason=None, limit=10) == []


def test_app_limit__bad_patterns_and_limits_are_refused() -> None:
    app = App()
    for pattern in ("", "a b", "tenant:[x]", 3):
        with pytest.raises(ValueError, match="invalid key pattern"):
            app.limit(pattern, 1)  # type: ignore[arg-type]
    for limit in (0, -1, True, 2.0, "2", 1_000_001):
        with pytest.raises(ValueError, match="invalid concurrency limit"):
            app.limit("tenant:*", limit)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid concurrency key"):
        app.agent("a", concurrency_key="bad key")(lambda ctx, req: {})
    with pytest.raises(ValueError, match="invalid concurrency limit"):
        app.agent("b", concurrency_limit=0)(lambda ctx, req: {})
    assert app.limits == {}


def test_claim__never_more_running_than_the_limit(rt: Runtime) -> None:
    ids = rt.enqueue_many(
        [{"agent": "task", "concurrency_key": "tenant:a", "request": {"n": n}} for n in range(6)]
        + [{"agent": "task", "request": {"n": n}} for n in range(3)]
    )
    got = claim(rt)
    # Two of the key (its limit) and every run without a key, in one batch.
    assert Counter(c.run.state.concurrency_key for c in got) == {"tenant:a": 2, None: 3}
    # In claim order: one batch shares its available_at, so by run id.
    order = sorted(ids[:6])
    assert [c.run.id for c in got if c.run.state.concurrency_key] == order[:2]
    assert claim(rt) == []  # the key is full
    # One of them settles: its place is free, and the next run of the key is claimed.
    first = next(c for c in got if c.run.state.concurrency_key)
    run = first.run
    run.complete(result={})
    rt.store.append(run)
    (again,) = claim(rt)
    assert again.run.id == order[2]
    assert running_by_key(rt)["tenant:a"] == 2


def test_claim__racing_claimers_never_exceed_the_limit(rt: Runtime) -> None:
    """Eight threads claim at once, again and again, from three keys of limit 2; every run
    they take completes at once. At no claim's end does any key run more than its limit."""
    keys = ["tenant:a", "tenant:b", "tenant:c"]
    rt.enqueue_many([{"agent": "task", "concurrency_key": k} for k in keys for _ in range(30)])
    over: list[Counter[str | None]] = []
    done = Counter[str]()
    lock = threading.Lock()
    stop = threading.Event()

    def claimer(n: int) -> None:
        give_up = time.monotonic() + 60  # a bound on a broken claim, not a timing assertion
        while not stop.is_set() and time.monotonic() < give_up:
            got = claim(rt, limit=3, holder=f"worker:{n}")
            now = running_by_key(rt)
            if any(v > 2 for k, v in now.items() if k is not None):
                over.append(now)
            for c in got:
                run = c.run
                run.complete(result={})
                rt.store.append(run)
                with lock:
                    done[run.state.concurrency_key or ""] += 1
            if not got and sum(done.values()) >= 90:
                return

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    assert over == []
    assert done == dict.fromkeys(keys, 30)


def test_claim__keys_are_served_round_robin(rt: Runtime) -> None:
    """A key with a long backlog enqueued first does not starve the keys after it: each
    claim takes the least recently served key with a free place."""
    rt.enqueue_many([{"agent": "task", "concurrency_key": "tenant:big"} for _ in range(20)])
    rt.enqueue_many([{"agent": "task", "concurrency_key": f"tenant:s{n}"} for n in range(3)])
    order: list[str] = []
    for _ in range(8):
        (got,) = claim(rt, limit=1)
        order.append(got.run.state.concurrency_key)
        run = got.run
        run.complete(result={})
        rt.store.append(run)
    # Every small key is served before the big one's second run.
    assert order[:4] == ["tenant:big", "tenant:s0", "tenant:s1", "tenant:s2"]
    assert order[4:] == ["tenant:big"] * 4


def test_claim__a_suspended_run_frees_its_place(rt: Runtime) -> None:
    ids = [rt.enqueue("waits", concurrency_key="solo") for _ in range(3)]
    rt.work(burst=True, concurrency=2)
    # Each one waits for its signal, holding no place: all three were started.
    assert [rt.get(i).status for i in ids] == [RunStatus.WAITING_FOR_EVENT] * 3
    assert running_by_key(rt) == Counter()
    key_table(rt)  # the suspends released their places in the table too
    for i in ids:
        rt.signal(i, "go", {"ok": True})
    rt.work(burst=True, concurrency=3)
    assert [rt.get(i).status for i in ids] == [RunStatus.COMPLETED] * 3


def test_claim__a_reclaimed_run_frees_its_place(rt: Runtime) -> None:
    first, second = (rt.enqueue("task", concurrency_key="solo") for _ in range(2))
    (held,) = claim(rt, holder="worker:dead", lease_ms=30)
    assert held.run.id == first
    assert claim(rt) == []  # solo's one place is held
    time.sleep(0.1)
    Reaper(rt.store, rt.settings.retry_policy(), actor="reaper:test").reap_once()
    assert rt.get(first).status is RunStatus.QUEUED
    # The reaper's fenced write released the place: one run of the key is claimed again,
    # the one claimable first (the reclaimed run is claimable from its reclaim on).
    (again,) = claim(rt)
    assert again.run.id == second
    assert claim(rt) == []
    assert rt.get(first).status is RunStatus.QUEUED
    assert rt.get(first).state.concurrency_key == "solo"
    assert key_table(rt) == {"solo": (1, 1)}


def test_burst__waits_for_runs_held_back_by_their_limit(rt: Runtime) -> None:
    """A burst worker whose only claimable runs wait for a place held by another worker
    keeps going until that place frees and it has drained them."""
    ids = [rt.enqueue("task", concurrency_key="solo") for _ in range(3)]
    (held,) = claim(rt, holder="worker:other")
    assert rt.store.held_back(agents=rt.app.agent_names)
    done = threading.Event()
    report: list[Any] = []

    def burst() -> None:
        report.append(rt.work(burst=True))
        done.set()

    worker = threading.Thread(target=burst)
    worker.start()
    time.sleep(0.5)
    assert not done.is_set()  # held back, not finished
    run = held.run
    run.complete(result={})
    rt.store.append(run)
    worker.join(timeout=30)
    assert done.is_set()
    assert [rt.get(i).status for i in ids] == [RunStatus.COMPLETED] * 3
    assert not rt.store.held_back(agents=rt.app.agent_names)


def test_verify_and_rebuild_keep_the_keys(rt: Runtime) -> None:
    run_id = rt.enqueue("task", concurrency_key="tenant:a")
    assert rt.verify_index() == []
    rt.rebuild("run-index")
    assert keyed(rt, run_id) == ("tenant:a", 2)
    assert rt.verify_index() == []
    assert key_table(rt) == {"tenant:a": (0, 1)}  # the rebuild's rewrite counted once
    (got,) = claim(rt)
    assert got.run.id == run_id


def test_include_keeps_limits_and_agent_defaults(db_url: str) -> None:
    """An App built from another keeps its patterns (the including App's own win) and its
    agents' keys and limits; the async runtime places runs the same way."""
    combined = App()
    combined.limit("tenant:*", 7)
    combined.include(keyed_app())
    assert combined.limits["tenant:*"] == 7
    assert combined.limits["tenant:vip"] == 5
    assert combined.keying("mail") == ("mailbox:ops", 1)
    assert combined.keying("task", "tenant:a") == ("tenant:a", 7)
    assert combined.keying("task") == (None, None)
    rt = make_runtime(db_url, app=combined)
    try:
        run_id = asyncio.run(AsyncRuntime(rt).enqueue("task", concurrency_key="tenant:b"))
        assert keyed(rt, run_id) == ("tenant:b", 7)
    finally:
        rt.close()


def test_enqueue_many__batches_with_keys_in_opposite_orders_race(rt: Runtime) -> None:
    """Two threads enqueue batches over the same keys, one in ascending and one in
    descending order, again and again: every batch lands (no deadlock between them) and the
    keys' counts equal their runs."""
    keys = [f"tenant:k{n:02d}" for n in range(20)]
    errors: list[BaseException] = []

    def enqueue(order: list[str]) -> None:
        try:
            for _ in range(15):
                rt.enqueue_many([{"agent": "task", "concurrency_key": k} for k in order])
        except BaseException as error:
            errors.append(error)

    threads = [
        threading.Thread(target=enqueue, args=(keys,)),
        threading.Thread(target=enqueue, args=(keys[::-1],)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    got = claim(rt, limit=100)
    assert Counter(c.run.state.concurrency_key for c in got) == dict.fromkeys(keys, 2)
