"""Bulk enqueue (ADR 0044): `Runtime.enqueue_many`, `AsyncRuntime.enqueue_many`, the stores'
`create_many`, and the one-round-trip single enqueue, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from steptrail.async_runtime import AsyncRuntime
from steptrail.domain.digest import canonical_json
from steptrail.domain.enums import FailureClass, RunStatus, TerminationReason
from steptrail.domain.limits import MAX_DEPTH
from steptrail.domain.run import Run
from steptrail.runtime import InvalidItem, Runtime
from tests.conftest import make_runtime


def _items(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"agent": "scripted", "request": {"steps": 1, "result": {"i": i}}, **extra}
        for i in range(n)
    ]


def _count_runs(rt: Runtime) -> int:
    return len(rt.store.all_rows())


def _event_fields(rt: Runtime, run_id: uuid.UUID) -> dict[str, Any]:
    (created,) = rt.history(run_id)
    data = created.event.model_dump(mode="json")
    for varying in ("run_id", "timestamp", "originator_id", "trace_parent"):
        data.pop(varying, None)
    return {"type": type(created.event).__name__, **data}


def test_enqueue_many__writes_what_enqueue_writes(runtime: Runtime) -> None:
    """Row, creation event and saved request of a bulk-enqueued run equal a single
    enqueue's; the rebuilt index and views equal the live ones; workers run them."""
    request = {"steps": 1, "result": {"same": True}}
    one = runtime.enqueue("scripted", request, idempotency_key="single")
    (many,) = runtime.enqueue_many(
        [{"agent": "scripted", "request": request, "idempotency_key": "bulk"}]
    )
    assert _event_fields(runtime, one) == {
        **_event_fields(runtime, many),
        "idempotency_key": "single",
    }
    assert runtime.store.request(one) == runtime.store.request(many) == canonical_json(request)
    row_one, row_many = runtime.get(one), runtime.get(many)
    assert row_many.status is RunStatus.QUEUED
    assert row_many.available_at is not None
    assert row_many.created_at == row_many.updated_at == row_many.available_at
    assert row_one.state.model_dump(exclude={"run_id", "idempotency_key", "trace_parent"}) == (
        row_many.state.model_dump(exclude={"run_id", "idempotency_key", "trace_parent"})
    )
    ids = runtime.enqueue_many(_items(300), batch=128)
    assert len(set(ids)) == 300
    runtime.project()
    assert runtime.verify() == []
    report = runtime.work(concurrency=4, burst=True)
    assert report.outcomes.get("completed") == 302
    runtime.project()
    assert runtime.verify() == []


def test_enqueue_many__keys_as_if_enqueued_one_by_one(runtime: Runtime) -> None:
    """A taken key returns its run; a key repeated in the items (in one batch or across
    batches) returns the run of its first occurrence; no key is ever written twice."""
    existing = runtime.enqueue("scripted", {"steps": 1}, idempotency_key="old")
    items = _items(10)
    items[1]["idempotency_key"] = "old"
    items[2]["idempotency_key"] = "dup"
    items[3]["idempotency_key"] = "dup"  # same batch as its first occurrence
    items[9]["idempotency_key"] = "dup"  # a later batch
    items[5]["idempotency_key"] = "solo"
    ids = runtime.enqueue_many(items, batch=4)
    assert ids[1] == existing
    assert ids[3] == ids[9] == ids[2]
    assert ids[2] != existing
    assert len(set(ids)) == 8
    assert _count_runs(runtime) == 8  # the one existing and 7 new
    again = runtime.enqueue_many(items, batch=3)  # all over again: keyed ones come back
    assert [again[i] for i in (1, 2, 3, 5, 9)] == [ids[i] for i in (1, 2, 3, 5, 9)]
    assert runtime.enqueue("scripted", {}, idempotency_key="solo") == ids[5]
    keys = [r.state.idempotency_key for r in runtime.store.all_rows() if r.state.idempotency_key]
    assert sorted(keys) == ["dup", "old", "solo"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"agent": "nope", "request": {}}, "unknown agent"),
        ({"agent": "scripted", "request": {"steps": "many"}}, "steps"),
        ({"agent": "scripted", "request": [1, 2]}, "JSON object"),
        ({"agent": "scripted", "request": {}, "idempotency_key": "  "}, "blank"),
        ({"agent": "scripted", "request": {}, "idempotency_key": 7}, "string"),
        ({"agent": "scripted", "request": {}, "idempotency_key": "k" * 1001}, "at most"),
        ({"agent": "scripted", "request": {}, "actor": "\x1b[31m"}, "actor"),
        ({"agent": "scripted", "request": {}, "weight": 1}, "unknown field 'weight'"),
        ({"agent": "scripted", "request": {}, "priority": 1000}, "invalid priority"),
        ({"agent": "scripted", "request": {}, "queue": "nowhere"}, "unknown queue"),
        ({"request": {}}, "needs an agent"),
        ("scripted", "must be an object"),
    ],
)
def test_enqueue_many__bad_item_writes_nothing(runtime: Runtime, bad: Any, message: str) -> None:
    items: list[Any] = _items(20)
    items[17] = bad
    with pytest.raises(InvalidItem) as caught:
        runtime.enqueue_many(items, batch=5)
    assert caught.value.index == 17
    assert message in str(caught.value)
    assert str(caught.value).startswith("item 17: ")
    assert _count_runs(runtime) == 0


def test_enqueue_many__limits_of_hostile_input(db_url: str) -> None:
    """Issue 11's limits hold per item: too deep, too large; and a deep but legal request
    is stored and read back intact."""
    rt = make_runtime(db_url, max_request_bytes=10_000)
    try:
        deep: Any = "leaf"
        for _ in range(MAX_DEPTH + 5):
            deep = {"d": deep}
        items = _items(6)
        items[4] = {"agent": "scripted", "request": {"result": deep}}
        with pytest.raises(InvalidItem, match=r"item 4: .*levels"):
            rt.enqueue_many(items)
        items[4] = {"agent": "scripted", "request": {"result": {"x": "x" * 20_000}}}
        with pytest.raises(InvalidItem, match=r"item 4: .*STEPTRAIL_MAX_REQUEST_BYTES"):
            rt.enqueue_many(items)
        assert _count_runs(rt) == 0
        legal: Any = {"leaf": ["a", 1, None, 2.5, "é\u202e"]}
        for _ in range(MAX_DEPTH - 4):
            legal = {"n": legal}
        (run_id,) = rt.enqueue_many([{"agent": "scripted", "request": {"result": legal}}])
        stored = rt.store.request(run_id)
        assert stored is not None
        assert json.loads(stored) == {"result": legal}
    finally:
        rt.close()


def test_enqueue_many__one_statement_per_batch_on_postgres(pg_url: str) -> None:
    """A batch is one round trip and one NOTIFY per agent, whatever its size."""
    rt = make_runtime(pg_url)
    try:
        with psycopg.connect(pg_url, autocommit=True) as listener:
            listener.execute("LISTEN steptrail_queued")
            rt.enqueue_many(_items(2500), batch=1000)
            time.sleep(0.2)
            notes = list(listener.notifies(timeout=0.5, stop_after=100))
        assert [n.payload for n in notes] == ["scripted"] * 3
        assert _count_runs(rt) == 2500
    finally:
        rt.close()


def test_enqueue_many__wakes_idle_sqlite_workers(sqlite_url: str) -> None:
    rt = make_runtime(sqlite_url)
    try:
        rt.store.wait_for_work(0)  # clear
        woke: list[bool] = []
        waiter = threading.Thread(target=lambda: woke.append(_woken_within(rt, 5.0)))
        waiter.start()
        time.sleep(0.1)
        rt.enqueue_many(_items(3))
        waiter.join()
        assert woke == [True]
    finally:
        rt.close()


def _woken_within(rt: Runtime, timeout: float) -> bool:
    started = time.monotonic()
    rt.store.wait_for_work(timeout)
    return time.monotonic() - started < timeout


def _insert_uncommitted(pg_url: str, key: str) -> tuple[psycopg.Connection[Any], uuid.UUID]:
    """A run with `key` inserted by a transaction left open (as a concurrent enqueuer)."""
    rt = make_runtime(pg_url)
    try:
        run = Run.enqueue(
            run_id=uuid.uuid4(), agent="scripted", request_digest="d", actor="t",
            idempotency_key=key,
        )  # fmt: skip
        params = {**rt.store._params(run), "topic": "t", "state": b"{}", "request": None}
    finally:
        rt.close()
    conn = psycopg.connect(pg_url)
    conn.execute(rt.store.q["insert_run"], params)
    return conn, run.id


@pytest.mark.parametrize("bulk", [False, True])
def test_taken_key_committed_during_the_insert_is_read_after(pg_url: str, bulk: bool) -> None:
    """The key's run commits while our insert waits on it, after our snapshot: the existing
    run is still returned (by the fallback read), and nothing is written twice."""
    conn, other = _insert_uncommitted(pg_url, "raced")
    rt = make_runtime(pg_url)
    got: list[uuid.UUID] = []
    try:

        def enqueue() -> None:
            if bulk:
                got.extend(
                    rt.enqueue_many([*_items(2), {"agent": "scripted", "idempotency_key": "raced"}])
                )
            else:
                got.append(rt.enqueue("scripted", {}, idempotency_key="raced"))

        worker = threading.Thread(target=enqueue)
        worker.start()
        time.sleep(0.5)  # it now waits on the uncommitted row's key
        assert worker.is_alive()
        conn.commit()
        worker.join(timeout=10)
        assert got[-1] == other
        keyed = [r for r in rt.store.all_rows() if r.state.idempotency_key == "raced"]
        assert [r.run_id for r in keyed] == [other]
    finally:
        conn.close()
        rt.close()


def test_async_enqueue_many(db_url: str) -> None:
    async def main() -> list[uuid.UUID]:
        rt = AsyncRuntime(make_runtime(db_url))
        try:
            ids = await rt.enqueue_many(iter(_items(30)), batch=7)
            for run_id in ids:
                assert (await rt.get(run_id)).status is RunStatus.QUEUED
            return ids
        finally:
            await rt.close()

    assert len(set(asyncio.run(main()))) == 30


def _settled(i: int, holder: str = "worker:load") -> Run:
    run = Run.enqueue(run_id=uuid.uuid4(), agent="scripted", request_digest="d", actor="load")
    run.claim(holder=holder, lease_ms=60_000)
    run.record_step(kind="llm", name="s", duration_ms=3, payload={"i": i})
    if i % 3 == 0:
        run.complete(result={"i": i})
    elif i % 3 == 1:
        run.dead_letter(
            actor=holder,
            reason=TerminationReason.NOT_RETRYABLE,
            cause="test",
            failure_class=FailureClass.CLIENT_ERROR,
        )
    else:
        run.cancel(actor="load")
    return run


def test_bulk_load_settled__verify_clean_and_as_written(runtime: Runtime) -> None:
    """The benchmark loader writes logs and index rows a rebuild agrees with; failed runs
    keep their request; nothing loaded is claimable; purge removes loaded runs."""
    at = datetime.now(UTC) - timedelta(days=3)
    runs = [(_settled(i), at + timedelta(seconds=i), b'{"steps":1}' if i % 3 == 1 else None)
            for i in range(60)]  # fmt: skip
    assert runtime.store.bulk_load_settled(runs) == 60
    runtime.project()
    assert runtime.verify() == []
    first, stamp, _ = runs[1]
    history = runtime.history(first.id)
    assert [type(e.event).__name__ for e in history] == [
        "Queued", "Claimed", "StepRecorded", "DeadLettered",
    ]  # fmt: skip
    assert [e.recorded_at for e in history] == [
        stamp + k * timedelta(milliseconds=1) for k in range(4)
    ]
    assert runtime.get(first.id).status is RunStatus.FAILED
    assert runtime.store.request(first.id) == b'{"steps":1}'
    assert runtime.store.request(runs[0][0].id) is None
    assert runtime.store.claim(holder="w", lease_ms=1000, agents=["scripted"]) is None
    deadline = time.monotonic() + 60  # PostgreSQL: the views wait for older transactions
    while runtime.views.status_counts() == {} and time.monotonic() < deadline:
        time.sleep(0.1)
        runtime.project()
    counts = runtime.views.status_counts()
    assert counts == {("scripted", "completed"): 20, ("scripted", "failed"): 20,
                      ("scripted", "cancelled"): 20}  # fmt: skip
    assert runtime.purge(2).total == 60
    assert runtime.verify() == []
