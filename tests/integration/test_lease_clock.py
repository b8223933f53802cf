"""The lease clock under lock waits (ADR 0016): a lease starts when its write got its locks,
never before, and the reaper judges staleness only after writes already queued have landed.

The database is locked from outside for longer than a lease (PostgreSQL: `LOCK TABLE` as a
rebuild takes it; SQLite: another connection holding the write lock), while a heartbeat
queues behind the lock.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg

from steptrail.domain.enums import RunStatus
from steptrail.domain.retry import RetryPolicy
from steptrail.domain.run import Run
from steptrail.infrastructure.sqlite import path_from_url
from steptrail.workers.reaper import Reaper

LEASE_MS = 800
WAIT_S = 1.5  # longer than the lease: the store's old lease runs out while we wait


def claimed_run(store: Any) -> Run:
    store.create(
        Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t"), request=b"{}"
    )
    claimed = store.claim(holder="worker:live", lease_ms=LEASE_MS, agents=["a"])
    assert claimed is not None
    return claimed.run  # type: ignore[no-any-return]


@contextlib.contextmanager
def locked(db_url: str) -> Iterator[dict[str, datetime]]:
    """Hold the database's write lock until the block ends; yields where the store's clock
    stood when the lock was released (`released`)."""
    out: dict[str, datetime] = {}
    if db_url.startswith("postgresql"):
        with psycopg.connect(db_url) as conn:
            conn.execute("LOCK TABLE steptrail_runs, steptrail_events IN EXCLUSIVE MODE")
            yield out
            row = conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            out["released"] = row[0]
            conn.commit()
    else:
        conn = sqlite3.connect(path_from_url(db_url), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield out
            from steptrail.infrastructure.sqlite import to_datetime

            released = to_datetime(time.time_ns() // 1000)
            assert released is not None
            out["released"] = released
            conn.execute("COMMIT")
        finally:
            conn.close()


def in_thread(target: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["value"] = target()
        except BaseException as error:  # reported by the test's assertions
            box["error"] = error

    thread = threading.Thread(target=go)
    thread.start()
    return thread, box


def test_lease_clock__renewal_after_a_lock_wait_gets_a_whole_lease(store: Any, db_url: str) -> None:
    """A heartbeat that queued behind a lock for longer than a lease commits a lease that
    ends a whole lease after the lock was released, not after the heartbeat was sent."""
    run = claimed_run(store)
    run.renew_lease()
    with locked(db_url) as lock:
        thread, box = in_thread(lambda: store.append(run))
        time.sleep(WAIT_S)
        assert thread.is_alive(), "the heartbeat must be waiting on the lock"
    thread.join(10)
    assert "error" not in box, box
    row = store.row(run.id)
    assert row.lease_expires_at is not None
    lease_s = (row.lease_expires_at - lock["released"]).total_seconds()
    assert lease_s >= LEASE_MS / 1000 - 0.005, lease_s  # the clock's resolution, no more
    # The rebuilt index folds the event's recorded_at into the same instant.
    assert row.updated_at == store.history(run.id)[-1].recorded_at


def test_lease_clock__reaper_waits_for_a_queued_renewal(store: Any, db_url: str) -> None:
    """The lease runs out while the holder's renewal waits on a lock; a reaper pass started
    then waits too, sees the renewal, and reclaims nothing."""
    run = claimed_run(store)
    run.renew_lease()
    reaper = Reaper(store, RetryPolicy(), actor="reaper:test")
    with locked(db_url):
        beat, beat_box = in_thread(lambda: store.append(run))
        time.sleep(LEASE_MS / 1000 + 0.3)  # the old lease is over by the store's clock
        reap, reap_box = in_thread(lambda: reaper.reap_once(10))
        time.sleep(WAIT_S - LEASE_MS / 1000)
    beat.join(10)
    reap.join(10)
    assert "error" not in beat_box, beat_box
    assert "error" not in reap_box, reap_box
    assert reap_box["value"].requeued == 0
    assert store.row(run.id).status is RunStatus.RUNNING
    assert store.row(run.id).state.version == run.version


def test_lease_clock__renewal_queued_behind_the_reaper_is_not_reclaimed(
    store: Any, db_url: str
) -> None:
    """The reaper asks first, then the holder sends its renewal while its lease still runs;
    the lock outlasts the lease. The reaper is let in first and must not find the run stale:
    it judges leases at the instant it asked (ADR 0049). Judged at the instant it was let
    in, the run was stale, and only the race between the woken renewal and the reclaim
    decided whether a live run was taken from its worker."""
    run = claimed_run(store)
    run.renew_lease()
    with locked(db_url):
        time.sleep(0.05)
        look, look_box = in_thread(lambda: store.stale(10))
        time.sleep(0.2)  # the reaper is waiting; the lease (0.8 s) still runs
        beat, beat_box = in_thread(lambda: store.append(run))
        time.sleep(WAIT_S)  # the lock outlasts the lease
        assert look.is_alive(), "the reaper must be waiting on the lock"
    look.join(10)
    beat.join(10)
    assert "error" not in look_box, look_box
    assert "error" not in beat_box, beat_box
    assert [r.id for r in look_box["value"]] == []


def _waiting_pid(url: str, other_than: int) -> int:
    """The pid of the backend waiting for a lock on this database (bounded wait)."""
    deadline = time.monotonic() + 10
    with psycopg.connect(url, autocommit=True) as watch:
        while time.monotonic() < deadline:
            row = watch.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> %s",
                (other_than,),
            ).fetchone()
            if row is not None:
                return int(row[0])
            time.sleep(0.01)
    raise AssertionError("the writer never queued behind the reaper's lock")


def test_writers_take_the_run_index_before_the_log__no_deadlock_with_the_reaper(
    pg_url: str,
) -> None:
    """ADR 0054, deterministically: a reaper holds SHARE on the run index (its first lock)
    while a claim and a purge batch start. Each must queue for the run index before it
    holds anything on the log, so that the reaper's second lock (SHARE on the log) is
    granted at once. The claim of migration 0018 and the old purge took the log first and
    this ended in a deadlock (seen once in the chaos suite)."""
    from steptrail.infrastructure.factory import open_store

    store: Any = open_store(pg_url)
    try:
        run = claimed_run(store)
        run.complete()
        store.append(run)  # something to purge
        store.create(
            Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t"),
            request=b"{}",
        )  # something to claim
        writers = {
            "claim": lambda: store.claim_batch(holder="w", lease_ms=60_000, agents=["a"], limit=4),
            "purge": lambda: store.purge_batch(
                category="completed",
                statuses=["completed"],
                cutoff=datetime(3000, 1, 1, tzinfo=UTC),
                limit=10,
            ),
        }
        for name, write in writers.items():
            with psycopg.connect(pg_url) as reaper:
                reaper.execute("SET lock_timeout = '5s'")
                reaper.execute("LOCK TABLE steptrail_runs IN SHARE MODE")
                me = reaper.info.backend_pid
                done: dict[str, Any] = {}
                thread = threading.Thread(
                    target=lambda done=done, write=write: done.update(result=write()), daemon=True
                )
                thread.start()
                writer = _waiting_pid(pg_url, me)
                held = reaper.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                    " WHERE l.pid = %s AND l.granted AND c.relname = 'steptrail_events'",
                    (writer,),
                ).fetchone()
                assert held == (0,), f"the {name} holds the log while it waits for the index"
                reaper.execute("LOCK TABLE steptrail_events IN SHARE MODE")  # no deadlock
                reaper.commit()
            thread.join(10)
            assert not thread.is_alive()
            assert len(done["result"]) == 1, name
    finally:
        store.close()
