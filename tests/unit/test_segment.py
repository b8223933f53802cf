"""The segment's lease arithmetic and ambiguity handling, and the lease keeper's guard, with a
fake store and a fake clock (no database)."""

from __future__ import annotations

import threading
import uuid
from uuid import UUID

import pytest
import structlog

from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.domain.run import Run
from steptrail.workers.lease import LeaseKeeper
from steptrail.workers.segment import LeaseLost, Segment


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeStore:
    """Keeps one run's committed state; `script` makes the next calls fail or stall."""

    def __init__(self, run: Run, clock: FakeClock) -> None:
        self.committed = run.state
        self.clock = clock
        self.appends: list[int] = []
        self.append_script: list[str] = []
        self.load_script: list[str] = []
        self.stall_s = 0.0

    def append(self, run: Run, *, resumable: bytes | None = None) -> None:
        action = self.append_script.pop(0) if self.append_script else "ok"
        if action == "down":
            raise StoreUnavailable("connection refused")
        if run.committed_version != self.committed.version:
            raise VersionConflict("somebody appended first")
        self.clock.now += self.stall_s  # the append waits on a lock before it commits
        self.committed = run.state
        self.appends.append(run.state.version)
        if action == "lost-reply":
            raise StoreUnavailable("server closed the connection unexpectedly")
        run.mark_committed()

    def load(self, run_id: UUID) -> Run | None:
        action = self.load_script.pop(0) if self.load_script else "ok"
        if action == "down":
            raise StoreUnavailable("connection refused")
        return _rebuilt(self)


def _rebuilt(store: FakeStore) -> Run:
    return Run(store.committed)


def running_segment(lease_s: float = 3.0) -> tuple[Segment, FakeStore, FakeClock]:
    run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
    run.mark_committed()
    run.claim(holder="worker:test", lease_ms=int(lease_s * 1000))
    run.mark_committed()
    clock = FakeClock()
    store = FakeStore(run, clock)
    segment = Segment(
        store,  # type: ignore[arg-type]
        run,
        lease_s=lease_s,
        log=structlog.get_logger(),
        clock=clock,
        sleep=lambda s: setattr(clock, "now", clock.now + s),
    )
    return segment, store, clock


def test_segment__lease_counted_from_the_send_not_the_reply() -> None:
    """An append that waited on a lock before committing leaves the segment timing its lease
    from when it was sent: the next renewal is due sooner, never later, than the store's."""
    segment, store, clock = running_segment(lease_s=3.0)
    store.stall_s = 1.2  # more than a third of the lease
    sent = clock.now
    segment.commit(lambda r: r.record_step(kind="llm", name="s", duration_ms=1))
    assert segment.last_ok == sent
    store.stall_s = 0.0
    segment.try_renew()  # a third of a lease has passed since the send: renew now
    assert len(store.appends) == 2


def test_segment__lease_from_the_claims_send() -> None:
    """A segment made after a claim counts its lease from the claim's send."""
    segment, _, clock = running_segment()
    again = Segment(
        segment.store,
        segment.run,
        lease_s=3.0,
        log=structlog.get_logger(),
        clock=clock,
        lease_from=clock.now - 1.0,
    )
    assert again.last_ok == clock.now - 1.0


def test_segment__renewal_in_doubt_is_settled_before_the_next_append() -> None:
    """A background renewal whose reply is lost while the store cannot be read stays in
    doubt; the next append looks first, finds the renewal landed, and goes on from there
    instead of conflicting with its own write."""
    segment, store, clock = running_segment(lease_s=3.0)
    clock.now += 1.1
    store.append_script = ["lost-reply"]
    store.load_script = ["down"]
    segment.try_renew()
    assert store.appends == [3]  # it landed, the segment could not know
    assert segment.lost is None
    segment.commit(lambda r: r.record_step(kind="llm", name="s", duration_ms=1))
    assert store.appends == [3, 4]
    assert segment.run.committed_version == 4


def test_segment__foreign_write_after_doubt_is_a_loss() -> None:
    """Doubt settled by a load that shows somebody else's write: the run is lost."""
    segment, store, clock = running_segment(lease_s=3.0)
    store.append_script = ["down"]
    store.load_script = ["down"]
    clock.now += 1.1
    segment.try_renew()
    other = _rebuilt(store)
    other.cancel(actor="op")
    store.committed = other.state
    with pytest.raises(LeaseLost):
        segment.commit(lambda r: r.record_step(kind="llm", name="s", duration_ms=1))


def test_segment__settled_run_is_not_renewed() -> None:
    """A run settled before the keeper untracked it holds no lease: renewing it does
    nothing and raises nothing."""
    segment, store, clock = running_segment()
    segment.commit(lambda r: r.complete(result={}))
    clock.now += 10
    segment.try_renew()
    assert store.appends == [3]


class Exploding:
    """A segment whose renewal raises an unexpected error."""

    def __init__(self) -> None:
        self.run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
        self.calls = 0

    def try_renew(self) -> None:
        self.calls += 1
        raise RuntimeError("a bug")


class Counting:
    def __init__(self) -> None:
        self.run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
        self.calls = 0
        self.done = threading.Event()

    def try_renew(self) -> None:
        self.calls += 1
        if self.calls >= 3:
            self.done.set()


def test_lease_keeper__an_error_does_not_end_renewal() -> None:
    """One segment's renewal raising anything leaves the keeper renewing the others."""
    keeper = LeaseKeeper(0.3)
    bad, good = Exploding(), Counting()
    try:
        keeper.track(bad)  # type: ignore[arg-type]
        keeper.track(good)  # type: ignore[arg-type]
        assert good.done.wait(10), "renewal stopped"
        assert bad.calls >= 2
        assert keeper.failures >= 2
    finally:
        keeper.close()


def test_lease_keeper__a_dead_thread_is_started_again() -> None:
    """Should the keeper's thread have died, tracking a segment starts a new one."""
    keeper = LeaseKeeper(0.3)
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    keeper._thread = dead
    good = Counting()
    try:
        keeper.track(good)  # type: ignore[arg-type]
        assert good.done.wait(10)
    finally:
        keeper.close()


def test_fake_store__sanity() -> None:
    """The fake store refuses an append at a stale version (so the tests above can fail)."""
    segment, store, _ = running_segment()
    store.committed = store.committed.model_copy(update={"version": 9})
    with pytest.raises(LeaseLost):
        segment.commit(lambda r: r.record_step(kind="llm", name="s", duration_ms=1))


def test_run__mark_committed_first_commits_the_landed_steps_journal() -> None:
    """Marking the first pending events committed (an append in doubt that landed) also
    drops their steps' journal entries, and keeps the later ones pending."""
    from steptrail.domain.journal import JournalEntry

    segment, _, _ = running_segment()
    run = segment.run

    def entry(seq: int) -> JournalEntry:
        return JournalEntry(seq=seq, position=seq, kind="llm", name="s", fingerprint="f")

    run.record_step(kind="llm", name="s", duration_ms=1, journal=entry(1))
    run.record_step(kind="llm", name="s", duration_ms=1, journal=entry(2))
    run.mark_committed_first(1)
    assert [seq for seq, _ in run.pending_journal] == [2]
    assert len(run.pending_events) == 1
    assert run.committed_version == run.version - 1


# -- quiet records (ADR 0085) ----------------------------------------------------------------


def _step(run: Run, name: str = "s") -> int:
    return run.record_step(kind="llm", name=name, duration_ms=1)


def test_segment__quiet_records_make_no_boundary_append() -> None:
    """A replay note and a wait's outcome record no effect: with only those pending and the
    claim's proof fresh, the next step's boundary appends nothing; they ride with the next
    append that something else makes, in the order they were made."""
    segment, store, _ = running_segment()
    segment.defer(lambda r: r.record_replay(count=2, last_seq=2), quiet=True)
    segment.defer(_step, quiet=True)  # the wait's outcome
    segment.boundary()
    assert store.appends == []
    segment.defer(lambda r: _step(r, "live"))  # the live step that followed
    segment.commit(lambda r: r.complete(result={}))
    assert store.appends == [6]  # replay note, outcome, step, completion: one append
    assert segment.run.pending_events == ()


def test_segment__an_effect_pending_behind_quiet_records_is_appended_at_the_boundary() -> None:
    """A live step's record after a quiet one still makes the boundary append, and the
    append carries both."""
    segment, store, _ = running_segment()
    segment.defer(lambda r: r.record_replay(count=1, last_seq=1), quiet=True)
    segment.defer(_step)
    segment.boundary()
    assert store.appends == [4]
    assert segment.run.pending_events == ()


def test_segment__an_effect_before_quiet_records_is_appended_at_the_boundary() -> None:
    """Quiet records made after a live step's record do not hide it."""
    segment, store, _ = running_segment()
    segment.defer(_step)
    segment.defer(lambda r: _step(r, "outcome"), quiet=True)
    segment.boundary()
    assert store.appends == [4]


def test_segment__quiet_records_with_a_stale_proof_renew_at_the_boundary() -> None:
    """With only quiet records pending and the last append older than half a lease, the
    boundary appends them with a lease renewal before the step may start."""
    segment, store, clock = running_segment(lease_s=3.0)
    segment.defer(lambda r: _step(r, "outcome"), quiet=True)
    clock.now += 1.6
    segment.boundary()
    assert store.appends == [4]  # the outcome and a LeaseRenewed, one append
    assert segment.last_ok == clock.now


def test_segment__quiet_marks_end_with_the_append_that_carried_them() -> None:
    """After an append lands, a new record is judged on its own: a live step deferred
    later makes its boundary append even though quiet records came before."""
    segment, store, _ = running_segment()
    segment.defer(lambda r: _step(r, "outcome"), quiet=True)
    segment.commit(lambda r: _step(r, "marker"))
    assert store.appends == [4]
    segment.defer(lambda r: _step(r, "live"))
    segment.boundary()
    assert store.appends == [4, 5]


def test_segment__the_keeper_renews_with_quiet_records() -> None:
    """The lease keeper's heartbeat carries quiet records like any pending step (no
    separate LeaseRenewed)."""
    segment, store, clock = running_segment(lease_s=3.0)
    segment.defer(lambda r: _step(r, "outcome"), quiet=True)
    clock.now += 1.1
    segment.try_renew()
    assert store.appends == [3]
    assert [type(e).__name__ for e in segment.run.pending_events] == []
