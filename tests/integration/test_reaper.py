"""The reaper: who gets reclaimed, who gets dead-lettered, and who wins a race."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from steptrail.domain.enums import Effect, RunStatus, TerminationReason, WaitKind
from steptrail.domain.errors import VersionConflict
from steptrail.domain.retry import RetryPolicy
from steptrail.domain.run import Run
from steptrail.workers.reaper import Reaper

AGENTS = ["a"]


def stale_run(store: Any, *, lease_ms: int = 30) -> Run:
    """A queued run claimed by a worker that then went silent."""
    store.create(
        Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t"), request=b"{}"
    )
    claimed = store.claim(holder="worker:dead", lease_ms=lease_ms, agents=AGENTS)
    assert claimed is not None
    return claimed.run  # type: ignore[no-any-return]


def reaper(store: Any, **policy: Any) -> Reaper:
    return Reaper(store, RetryPolicy(**policy), actor="reaper:test")


def test_reap__reclaims_onto_the_queue_without_delay(store: Any) -> None:
    """A stale run with budget left is reclaimed and claimable again at once."""
    run = stale_run(store)
    time.sleep(0.1)
    report = reaper(store).reap_once()
    assert (report.reaped, report.requeued, report.dead_lettered, report.skipped) == (1, 1, 0, 0)
    again = store.claim(holder="worker:live", lease_ms=60_000, agents=AGENTS)
    assert again.run.id == run.id
    assert again.run.state.requeue_count == 1


def test_reap__pending_non_idempotent_write_dead_letters(store: Any) -> None:
    """A worker that died mid-write leaves a run that must not run again."""
    expired = stale_run(store)
    expired.mark_effect_pending(tool="send", effect=Effect.NON_IDEMPOTENT_WRITE)
    store.append(expired)
    time.sleep(0.1)
    reaper(store).reap_once()
    row = store.row(expired.id)
    assert row.state.reason is TerminationReason.NOT_RETRYABLE
    assert [h.event for h in store.history(expired.id)][-1].cause == "non_idempotent_write_pending"


def test_reap__interactive_run_has_no_request_and_dead_letters(store: Any) -> None:
    """An interactive run whose process died cannot be run again: not_retryable."""
    run = Run.start(
        run_id=uuid.uuid4(), agent="a", request_digest="d", holder="interactive:x", lease_ms=30
    )
    store.create(run, request=None)
    time.sleep(0.1)
    reaper(store).reap_once()
    row = store.row(run.id)
    assert row.status is RunStatus.FAILED
    assert row.state.reason is TerminationReason.NOT_RETRYABLE


def test_reap__budget_spent_dead_letters_retries_exhausted(store: Any) -> None:
    """Reclaims spend the same budget as retries; a poison run ends retries_exhausted."""
    stale_run(store)
    for attempt in range(3):
        if attempt:
            assert store.claim(holder="worker:dead", lease_ms=30, agents=AGENTS) is not None
        time.sleep(0.1)
        assert reaper(store, max_requeues=2).reap_once().reaped == 1
    (row,) = store.all_rows()
    assert row.state.reason is TerminationReason.RETRIES_EXHAUSTED
    assert row.state.requeue_count == 2


def test_reap__waiting_and_fresh_runs_untouched(store: Any) -> None:
    """Waiting runs hold no lease and fresh leases are not stale: the reaper skips both."""
    waiting = stale_run(store, lease_ms=30)
    waiting.suspend(kind=WaitKind.APPROVAL, digest="sha256:x")
    store.append(waiting, resumable=b"{}")
    stale_run(store, lease_ms=60_000)
    time.sleep(0.1)
    assert reaper(store).reap_once().reaped == 0
    assert store.row(waiting.id).status is RunStatus.WAITING_FOR_APPROVAL


def test_reap__limit_and_oldest_first(store: Any) -> None:
    """A pass handles at most `limit` runs, those whose lease expired first."""
    first = stale_run(store, lease_ms=10)
    time.sleep(0.05)
    stale_run(store, lease_ms=10)
    time.sleep(0.1)
    report = reaper(store).reap_once(limit=1)
    assert report.runs == [{"run_id": str(first.id), "verdict": "requeued"}]
    with pytest.raises(ValueError, match="positive"):
        reaper(store).reap_once(limit=0)


def race_once(store: Any) -> tuple[bool, bool, RunStatus]:
    """Fire a heartbeat and a reaper pass at one stale run at the same instant.

    Returns (heartbeat landed, reaper reclaimed in the race, status the race left), then
    settles the run so the next round starts clean.
    """
    run = stale_run(store, lease_ms=20)
    time.sleep(0.05)
    barrier = threading.Barrier(2)
    outcome: dict[str, Any] = {}

    def heartbeat() -> None:
        run.record_step(kind="llm", name="beat", duration_ms=1)
        barrier.wait()
        try:
            store.append(run)
            outcome["heartbeat"] = True
        except VersionConflict:
            outcome["heartbeat"] = False

    def reap() -> None:
        barrier.wait()
        outcome["report"] = reaper(store).reap_once()

    threads = [threading.Thread(target=heartbeat), threading.Thread(target=reap)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = store.load(run.id)
    status = final.status
    reclaimed = outcome["report"].requeued == 1
    if outcome["heartbeat"] and reclaimed:
        # Both may land only in turn: the reclaim came after the heartbeat's own 20 ms lease
        # had run out (a loaded machine), never in the race.
        *_, beat, reclaim = store.history(run.id)
        assert isinstance(beat.event, Run.StepRecorded)
        assert isinstance(reclaim.event, Run.Reclaimed)
        assert (reclaim.recorded_at - beat.recorded_at).total_seconds() >= 0.02
        assert status is RunStatus.QUEUED
        reclaimed, status = False, RunStatus.RUNNING  # the race itself: the heartbeat won
    final.cancel(actor="test")
    store.append(final)
    return outcome["heartbeat"], reclaimed, status


def test_reap__renewed_lease_wins_race(store: Any) -> None:
    """A heartbeat and a reclaim at the same moment: exactly one lands, every time."""
    for _ in range(25):
        heartbeat_landed, reclaimed, status = race_once(store)
        assert heartbeat_landed != reclaimed
        assert status is (RunStatus.QUEUED if reclaimed else RunStatus.RUNNING)


def test_reap__two_reapers_act_once(store: Any) -> None:
    """Reapers on several machines may overlap: each stale run is acted on exactly once."""
    for _ in range(10):
        stale_run(store)
    time.sleep(0.1)
    reports: list[Any] = []
    threads = [
        threading.Thread(target=lambda: reports.append(reaper(store).reap_once(100)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.requeued for r in reports) == 10
    assert all(len(store.history(r.run_id)) == 3 for r in store.all_rows())
