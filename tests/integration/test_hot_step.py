"""A step's update of its run's row is a heap-only (HOT) update on PostgreSQL (migration 0029,
ADR 0063): the lease and queued-since indexes read generated columns that a step leaves
as they were, and the reaper still finds every stale lease and only those."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import dict_row

from steptrail.domain.enums import PrivacyLevel, RunStatus
from steptrail.runtime import Runtime
from tests.conftest import make_runtime

STEPS = 200


def _updates(url: str, expected: int) -> tuple[int, int]:
    """(updates, HOT updates) of steptrail_runs once the statistics show `expected` updates
    (a backend reports its counts when it goes idle or exits, not at once)."""
    deadline = time.monotonic() + 15
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relname = 'steptrail_runs'"
            ).fetchone()
            assert row is not None
            if row[0] >= expected or time.monotonic() > deadline:
                return int(row[0]), int(row[1])
            time.sleep(0.1)


def _claim(rt: Runtime, lease_ms: int, n: int = 1) -> list[Any]:
    for _ in range(n):
        rt.enqueue("scripted", {"steps": 1})
    claimed = rt.store.claim_batch(
        holder="test-worker", lease_ms=lease_ms, agents=["scripted"], limit=n
    )
    assert len(claimed) == n
    return [c.run for c in claimed]


def test_step_append__is_a_heap_only_update(pg_url: str) -> None:
    """Of a run's steps, all but those that cross a half-lease boundary (30 s here) or find
    their page full before it is pruned leave every index of the run index alone."""
    rt = make_runtime(pg_url, lease_seconds=60)
    try:
        (run,) = _claim(rt, 60_000)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_reset()")
        for i in range(STEPS):
            run.record_step(kind="llm", name=f"s{i}", duration_ms=1, payload={"i": i})
            rt.store.append(run)
    finally:
        rt.close()  # its backends exit, and report their statistics
    updates, hot = _updates(pg_url, STEPS)
    assert updates >= STEPS  # and the claim's, if its backend reported after the reset
    assert hot >= STEPS * 0.9, (updates, hot)  # the old schema: 0


def _stale_ids(rt: Runtime) -> set[UUID]:
    return {run.id for run in rt.store.stale(100)}


def test_reaper__finds_every_expired_lease_and_passes_over_live_ones(pg_url: str) -> None:
    """The walk is along the expiry rounded down to half a lease: a run whose lease ran out
    is found whatever its bucket, one whose lease still runs is never returned or counted,
    even when its bucket has begun."""
    rt = make_runtime(pg_url)
    try:
        expired = _claim(rt, 60_000, n=3)
        live = _claim(rt, 3_600_000, n=2)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            # Expired a millisecond to an hour ago, with leases of a second to a day.
            ages = [("1 millisecond", 1_000), ("1 minute", 60_000), ("1 hour", 86_400_000)]
            for run, (ago, lease_ms) in zip(expired, ages, strict=True):
                conn.execute(
                    "UPDATE steptrail_runs SET lease_ms = %s, "
                    "lease_expires_at = now() - %s::interval WHERE run_id = %s",
                    (lease_ms, ago, run.id),
                )
            # Live for another ten seconds and another minute, with leases of a day: their
            # half-day bucket began before now, unless a bucket boundary (00:00 or 12:00
            # UTC) falls within the next two minutes; then wait for it to pass first.
            (wait_s,) = conn.execute(
                "SELECT GREATEST(0, extract(epoch FROM date_bin('12 hours', now() + "
                "interval '2 minutes', TIMESTAMPTZ '2000-01-01 00:00:00+00') - now()))::float"
            ).fetchone()
            time.sleep(wait_s + 0.1 if wait_s else 0)
            for run, ahead in zip(live, ["10 seconds", "1 minute"], strict=True):
                conn.execute(
                    "UPDATE steptrail_runs SET lease_ms = 86400000, "
                    "lease_expires_at = now() + %s::interval WHERE run_id = %s",
                    (ahead, run.id),
                )
            due = conn.execute(
                "SELECT count(*) FROM steptrail_runs WHERE status = 'running' "
                "AND lease_due_at <= now() AND lease_expires_at >= now()"
            ).fetchone()
        assert due == (2,)  # the live leases are in the walk, and must be passed over
        assert _stale_ids(rt) == {run.id for run in expired}
        assert rt.views.health().stale_leases == 3
        report = rt.reap()
        assert report.reaped == 3
        assert all(rt.get(run.id).status is RunStatus.QUEUED for run in expired)
        assert all(rt.get(run.id).status is RunStatus.RUNNING for run in live)
        assert rt.views.health().stale_leases == 0
    finally:
        rt.close()


def test_generated_columns__follow_every_writer(pg_url: str) -> None:
    """Enqueue, claim, step, settle and a rebuild of the index each leave the generated
    columns what their rule makes of the row (a reaper's requeue: the test above)."""
    rt = make_runtime(pg_url)
    try:
        run, done = _claim(rt, 10_000, n=2)
        run.record_step(kind="llm", name="s", duration_ms=1, payload={})
        rt.store.append(run)
        done.complete(result={}, privacy=PrivacyLevel.METADATA)
        rt.store.append(done)
        queued = rt.enqueue("scripted", {"steps": 1})
        rt.rebuild("run-index")
        with psycopg.connect(pg_url, autocommit=True, row_factory=dict_row) as conn:
            rows = conn.execute(
                "SELECT run_id, status, queued_at, updated_at, lease_due_at, lease_expires_at, "
                "lease_due_at = date_bin(lease_ms * interval '500 microseconds', "
                "lease_expires_at, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucketed "
                "FROM steptrail_runs"
            ).fetchall()
        by_id = {r["run_id"]: r for r in rows}
        waiting, running, ended = by_id[queued], by_id[run.id], by_id[done.id]
        assert waiting["status"] == "queued"
        assert waiting["queued_at"] == waiting["updated_at"]
        assert waiting["lease_due_at"] is None
        assert running["status"] == "running"
        assert running["queued_at"] is None
        assert running["lease_due_at"] <= running["lease_expires_at"]
        assert running["bucketed"] is True
        assert ended["status"] == "completed"
        assert ended["queued_at"] is None
        assert ended["lease_due_at"] is None
        assert rt.verify() == []
    finally:
        rt.close()


@pytest.mark.parametrize("lease_ms", [1, 86_400_001, 2**62])
def test_lease_due_at__odd_lease_lengths_write_and_are_found(pg_url: str, lease_ms: int) -> None:
    """A lease of a millisecond, of more than a day or of any bigint of milliseconds is
    bucketed without failing the write, and its run is found once its lease has run out."""
    rt = make_runtime(pg_url)
    try:
        (run,) = _claim(rt, 10_000)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE steptrail_runs SET lease_ms = %s, lease_expires_at = now() - "
                "interval '1 second' WHERE run_id = %s",
                (lease_ms, run.id),
            )
        assert _stale_ids(rt) == {run.id}
    finally:
        rt.close()
