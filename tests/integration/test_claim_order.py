"""PostgreSQL: a multi-row claim's events are read in version order (ADR 0018, 0037).

A claim takes its transaction id at its first locked row; the view runner reads the log by
(transaction, id). A row that another transaction changed and committed after the claim
began must not be claimed by it: were it claimed, its Claimed could sort before the other
transaction's events of the same run. It is not, because availability is judged at the
claim's start (now()) and every change to a queued run leaves it either not queued or
available later than that. Since ADR 0037 the claim locks its whole batch in one pass
(steptrail_claim, ADR 0048) before it writes any event, which narrows that window to the lock
pass; the tests below build what can still be built: a change that lands while the claim
waits to start, and a claim that sleeps between its rows. (SQLite has one writer at a time:
its ids commit in order, there is nothing to prove there.)
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from steptrail.domain.enums import FailureClass, RunStatus
from tests.conftest import make_runtime


def test_claim__row_changed_during_a_multi_row_claim_keeps_read_order(pg_url: str) -> None:
    """While a two-row claim sleeps writing its first run's Claimed, a second claimer finds
    nothing (the batch was locked in one pass before any write) and every run's events are
    read in version order (the views fold cleanly, verify is clean)."""
    rt = make_runtime(pg_url)
    store: Any = rt.store
    first = rt.enqueue("scripted", {})
    time.sleep(0.01)
    second = rt.enqueue("scripted", {})
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION steptrail_test_slow() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN IF NEW.originator_id = '" + str(first) + "' AND NEW.originator_version = 2 "
            "THEN PERFORM pg_sleep(1.5); END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER steptrail_test_slow BEFORE INSERT ON steptrail_events "
            "FOR EACH ROW EXECUTE FUNCTION steptrail_test_slow()"
        )
    try:
        got: dict[str, Any] = {}
        claimer = threading.Thread(
            target=lambda: got.update(
                runs=store.claim_batch(
                    holder="worker:slow", lease_ms=60_000, agents=["scripted"], limit=2
                )
            )
        )
        claimer.start()
        time.sleep(0.4)  # the slow claim holds both runs and sleeps in its first insert
        others = store.claim_batch(
            holder="worker:other", lease_ms=60_000, agents=["scripted"], limit=2
        )
        assert others == []
        claimer.join(10)
        assert {c.run.id for c in got["runs"]} == {first, second}
        for claimed in got["runs"]:
            claimed.run.requeue(delay_ms=0, failure_class=FailureClass.CONNECTION, error_type=None)
            store.append(claimed.run)
        assert rt.get(second).status is RunStatus.QUEUED
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER steptrail_test_slow ON steptrail_events")
            conn.execute("DROP FUNCTION steptrail_test_slow()")
    rt.project()
    for run_id in (first, second):
        versions = [
            n.version
            for n in rt.views.notifications(upto=rt.views.position())
            if n.run_id == run_id
        ]
        assert versions == sorted(versions)
        assert versions == list(range(1, len(versions) + 1))
    assert rt.verify() == []
    rt.close()


def test_claim__availability_is_judged_at_the_claims_start(pg_url: str) -> None:
    """A claim that waited to start (behind a table lock) does not take a run that became
    available while it waited, although the run is queued and available by the clock when
    the claim finally reads it: availability is now(), the transaction's start, not the
    moment of the read (with clock_timestamp() this run would be claimed, and its Claimed
    could sort before the change in the log's read order)."""
    rt = make_runtime(pg_url)
    ready = rt.enqueue("scripted", {})
    later = rt.enqueue("scripted", {})
    q = rt.store.q  # type: ignore[attr-defined]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE steptrail_runs SET available_at = now() + interval '1 hour' WHERE run_id = %s",
            (later,),
        )
    topic, state = "steptrail.Run.Claimed", b"{}"
    params = {
        "agents": ["scripted"],
        "topic": topic,
        "state": state,
        "holder": "worker:late",
        "lease_ms": 60_000,
        "limit": 2,
        "queues": None,
    }
    got: dict[str, Any] = {}
    with psycopg.connect(pg_url, autocommit=True) as locker, locker.transaction():
        locker.execute("LOCK TABLE steptrail_runs IN EXCLUSIVE MODE")

        def claim() -> None:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                got["rows"] = conn.execute(q["claim"], params).fetchall()

        claimer = threading.Thread(target=claim)
        claimer.start()
        time.sleep(0.5)  # the claim has started (its now() is taken) and waits for the lock
        assert "rows" not in got
        locker.execute(
            "UPDATE steptrail_runs SET available_at = clock_timestamp() WHERE run_id = %s",
            (later,),
        )
    claimer.join(10)
    assert [row[0] for row in got["rows"]] == [ready]
    assert rt.get(later).status is RunStatus.QUEUED
    rt.close()


def test_claim__racing_enqueues_every_claimed_run_is_claimed_whole(pg_url: str) -> None:
    """Claims racing a stream of enqueues (the queue near empty, so each claim takes runs that
    committed a moment ago): every claimed run's row moves with its Claimed event and comes
    with its request. Before ADR 0048 the claim's lock pass ran with a newer snapshot than
    its update: a run that committed in between got a Claimed event while its row stayed
    queued, and every later claim broke on the event's key (every worker, in practice)."""
    rt = make_runtime(pg_url)
    store: Any = rt.store
    per_producer = 800
    stop = threading.Event()
    errors: list[str] = []
    requests: dict[Any, bytes] = {}

    def produce(k: int) -> None:
        for i in range(per_producer):
            rt.enqueue("scripted", {"result": {"producer": k, "n": i}})

    def consume(k: int) -> None:
        while not stop.is_set():
            try:
                for item in store.claim_batch(
                    holder=f"worker:{k}", lease_ms=60_000, agents=["scripted"], limit=2
                ):
                    requests[item.run.id] = item.request
            except Exception as error:  # any error at all is the failure under test
                errors.append(repr(error)[:200])
                return

    producers = [threading.Thread(target=produce, args=(k,)) for k in range(3)]
    consumers = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join()
    deadline = time.monotonic() + 30
    while len(requests) < 3 * per_producer and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in consumers:
        t.join()
    try:
        assert errors == []
        assert len(requests) == 3 * per_producer
        assert all(rt.get(run_id).status is RunStatus.RUNNING for run_id in requests)
        assert all(body and b'"producer"' in body for body in requests.values())
        assert rt.verify_index() == []
    finally:
        rt.close()
