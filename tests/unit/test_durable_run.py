"""The aggregate's share of durable execution: pending journal entries travel with their
events, a decision step consumes the decision, the segment's deadline stops renewals."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
import structlog

from steptrail.domain.enums import WaitKind
from steptrail.domain.journal import JournalEntry
from steptrail.domain.run import DECISION_STEP, Run
from steptrail.workers.segment import LeaseLost, Segment
from tests.unit.test_run import resumed, running

ENTRY = JournalEntry(0, 1, "llm", "think", "f" * 16, value="thought")


def test_record_step__journal_entry_pending_with_its_seq() -> None:
    """A step's journal entry is pending with the event, paired with the step's seq."""
    run = running()
    run.record_step(kind="llm", name="a", duration_ms=1)
    seq = run.record_step(kind="llm", name="think", duration_ms=1, journal=ENTRY)
    assert seq == 2
    assert [seq for seq, _ in run.pending_journal] == [2]
    assert run.pending_journal[0][1].value == "thought"


def test_restore__drops_journal_entries_after_the_checkpoint() -> None:
    """A refused append forgets the entries triggered since its checkpoint, not earlier ones."""
    run = running()
    run.record_step(kind="llm", name="a", duration_ms=1, journal=ENTRY)
    checkpoint = run.checkpoint()
    run.record_step(kind="llm", name="b", duration_ms=1, journal=ENTRY)
    run.restore(checkpoint)
    assert [seq for seq, _ in run.pending_journal] == [1]


def test_mark_committed__clears_pending_journal() -> None:
    """Once the store recorded the events, their entries are no longer pending."""
    run = running()
    run.record_step(kind="llm", name="a", duration_ms=1, journal=ENTRY)
    run.mark_committed()
    assert run.pending_journal == ()


def test_decision_step__consumes_the_decision() -> None:
    """Recording a `decision` step clears the decision: a later request waits for a new one."""
    run = resumed()
    assert run.state.decision is not None
    run.record_step(kind="llm", name="think", duration_ms=1)
    assert run.state.decision is not None
    run.record_step(kind=DECISION_STEP, name=WaitKind.APPROVAL.value, duration_ms=0)
    assert run.state.decision is None


def test_replayed__recorded_without_changing_counts() -> None:
    """`Replayed` goes in the trail and leaves steps, tokens and cost as they were."""
    run = running()
    run.record_step(kind="llm", name="a", duration_ms=1, tokens=5)
    before = run.state
    run.record_replay(count=1, last_seq=1)
    assert isinstance(run.pending_events[-1], Run.Replayed)
    assert run.state.evolve(version=before.version) == before


class CountingStore:
    """Just enough of a store for a segment: counts appends."""

    def __init__(self) -> None:
        self.appends = 0

    def append(self, run: Run, *, resumable: bytes | None = None) -> None:
        self.appends += 1
        run.mark_committed()

    def load(self, run_id: UUID) -> Any:
        raise AssertionError("not expected")


def test_try_renew__stops_past_the_deadline() -> None:
    """The lease keeper renews a due lease, but not once the segment's deadline passed."""
    now = [0.0]
    store = CountingStore()
    run = running()
    run.mark_committed()
    segment = Segment(
        store,  # type: ignore[arg-type]
        run,
        lease_s=3.0,
        log=structlog.get_logger(),
        clock=lambda: now[0],
    )
    now[0] = 1.5
    segment.try_renew()
    assert store.appends == 1
    segment.renew_until = 2.0
    now[0] = 3.0
    segment.try_renew()
    assert store.appends == 1
    segment.renew_until = None
    segment.try_renew()
    assert store.appends == 2


def test_close__later_calls_through_the_segment_are_fenced() -> None:
    """After the segment ended, a straggler (an abandoned step thread) cannot append."""
    store = CountingStore()
    run = running()
    run.mark_committed()
    segment = Segment(store, run, lease_s=3.0, log=structlog.get_logger())  # type: ignore[arg-type]
    segment.close()
    with pytest.raises(LeaseLost):
        segment.commit(lambda r: r.renew_lease())
    assert store.appends == 0
