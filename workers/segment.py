"""A segment: one stretch of execution of a run under one lease, and every append it makes.

The segment owns the in-memory `Run` (so a step never reloads or replays the run) and is the
only place its appends happen. Four rules make it safe:

* **Boundaries.** A finished step's record is kept in memory and appended at the next step
  boundary: before the next step starts, before a write tool runs (with its pending-effect
  marker), or with the settle. So every step starts only after an append proved the run is
  still this segment's, and a run of N steps costs N appends after its claim (the last step
  rides with the settle). This is the reference system's "persist the boundary step after
  the renewal check" (ADR 0011).
* **Fencing.** Each append is fenced on the version the segment last wrote. A conflict means
  somebody else appended: the segment has lost the run. It stops at once, records nothing
  more and settles nothing; the outcome is `cancelled` if a cancel did it, else `lease_lost`.
* **Ambiguity.** A store error during an append leaves it unknown whether the append landed.
  The segment looks before it sends anything again: its own state at its version means it
  landed; another version means it lost the run; the old version means retry. While it
  cannot look, it sends nothing (a blind retry would conflict with its own write and be
  mistaken for a lost run), and the doubt outlives the call that raised it.
* **Self-fencing.** Retrying stops half a lease after the last confirmed append was sent
  (the store's lease starts later than that, never earlier). By then the
  segment cannot know whether the reaper is about to reclaim the run, so it gives the run up
  (`lease_lost`) and never starts another step or write (ADR 0007).

Appends come from the agent's thread and from the lease keeper's thread (which renews a lease
a third of the way to expiry); a lock keeps them one at a time, and the version orders them.
The keeper renews only until `renew_until` (a step's or the segment's deadline, ADR 0015): a
segment stuck past its deadline lets its lease expire, so the reaper can take the run back.
Once the segment has ended (`close`), every further call through it raises `LeaseLost`, so
a step thread abandoned at its deadline can record nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from steptrail.domain.enums import Outcome, RunStatus
from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.domain.ports import ClaimedRun, ClaimRequest, RunStore
from steptrail.domain.run import Checkpoint, Run, RunEvent, RunState
from steptrail.domain.waits import SignalArrived, SignalGuard
from steptrail.workers import telemetry

Clock = Callable[[], float]


class LeaseLost(BaseException):  # a signal, like CancelledError, not an error
    """The segment no longer owns its run. Derives from BaseException so that an agent's
    `except Exception` cannot swallow it and carry on acting without the lease."""

    def __init__(self, outcome: Outcome, why: str) -> None:
        super().__init__(why)
        self.outcome = outcome
        self.why = why


@dataclass(frozen=True)
class _Doubt:
    """An append whose reply was lost: the state it would leave and when it was sent."""

    state: RunState
    sent: float


@dataclass
class NextClaim:
    """A worker's request that the segment's settle also claim the worker's next run, in
    the same transaction (ADR 0058), and what came of it.

    Asked once, by the first append that leaves the run not running: a settle whose reply
    was lost is retried without a claim (whatever the lost attempt claimed stays leased to
    this worker until the reaper takes it back, as after any claim whose reply was lost).
    Not asked once `stop` is set: a stopping worker takes no new run.
    """

    request: ClaimRequest
    stop: threading.Event
    claimed: list[ClaimedRun] = field(default_factory=list)
    sent: float | None = None  # when the settle that claimed was sent: the leases count from it
    latency_s: float = 0.0  # how long that settle took, its claim included

    def wanted(self) -> bool:
        return self.sent is None and not self.stop.is_set()


@dataclass(frozen=True)
class SegmentTimings:
    """Lease arithmetic of a segment, in seconds."""

    lease_s: float

    @property
    def renew_after_s(self) -> float:
        """Without an append for this long, the lease keeper appends one."""
        return self.lease_s / 3

    @property
    def self_fence_after_s(self) -> float:
        """Without a confirmed append for this long, the segment stops acting."""
        return self.lease_s / 2


class Segment:
    """Appends for one run under one lease; see the module docstring."""

    def __init__(
        self,
        store: RunStore,
        run: Run,
        *,
        lease_s: float,
        log: structlog.typing.FilteringBoundLogger,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        lease_from: float | None = None,
    ) -> None:
        self.store = store
        self.run = run
        self.timings = SegmentTimings(lease_s)
        self.clock = clock
        self.sleep = sleep
        self.lock = threading.RLock()
        # When the write that granted the lease was sent (by `clock`): the store's lease
        # started after that, so counting from it never overestimates what is left.
        self.last_ok = clock() if lease_from is None else lease_from
        self.lost: LeaseLost | None = None
        self._doubt: _Doubt | None = None
        # Monotonic instant after which the lease keeper stops renewing (None: never).
        self.renew_until: float | None = None
        holder = run.state.holder or "?"
        self.log = log.bind(run_id=str(run.id), worker_id=holder)
        if run.state.trace_id is not None:
            self.log = self.log.bind(trace_id=run.state.trace_id)
        # The segment's observer (ADR 0033); the executor sets it once the segment starts.
        self.probe: telemetry.SegmentProbe = telemetry.NO_SEGMENT
        # Set by the worker: the settle claims its next run too (ADR 0058).
        self.next_claim: NextClaim | None = None
        # Pending events that record no effect (a `Replayed` note, a wait's outcome): they
        # do not make a boundary append (ADR 0085). Held by reference and compared by
        # identity; emptied by every append that lands.
        self._quiet: list[RunEvent] = []

    @property
    def holder(self) -> str:
        assert self.run.state.holder is not None
        return self.run.state.holder

    @property
    def fencing_token(self) -> str:
        """`<run id>:<claim version>`: unique per segment, for outside idempotency keys."""
        return f"{self.run.id}:{self.run.state.claim_version}"

    def boundary(self) -> None:
        """A step boundary: append what is pending (the previous step's record), proving the
        run is still ours before anything else happens. Raises LeaseLost if it is not.

        With nothing pending the last append is the proof, unless it is older than half a
        lease (the store was down, or the agent worked long between steps): then the lease
        is renewed first, and the segment acts only if that succeeds.
        """
        if self.lost is not None:
            raise self.lost
        with self.lock:
            if self._effect_pending():
                self._append(self.run.checkpoint(), None)
            elif self.clock() - self.last_ok > self.timings.self_fence_after_s:
                checkpoint = self.run.checkpoint()
                self.run.renew_lease()
                self._append(checkpoint, None, retry=False)

    def defer(self, command: Callable[[Run], object], *, quiet: bool = False) -> object:
        """Apply `command` now and append what it triggered at the next boundary.

        `quiet`: what it triggered records no effect (a replay note, a wait's or a decision's
        outcome), so it does not make the next boundary append by itself: it rides with the
        next append that something else makes (ADR 0085). The claim's append, or the
        boundary's lease check, is the proof the next step needs; a segment lost before that
        append leaves the outcome to be recorded again by the next one, from the same state.
        """
        with self.lock:
            if self.lost is not None:
                raise self.lost
            if not quiet:
                return command(self.run)
            before = len(self.run.pending_events)
            result = command(self.run)
            self._quiet.extend(self.run.pending_events[before:])
            return result

    def _effect_pending(self) -> bool:
        """Whether a pending event is not quiet (see `defer`): a boundary appends it."""
        quiet = self._quiet
        pending = self.run.pending_events
        if not quiet:  # the usual case: a step's record, or nothing
            return bool(pending)
        return any(all(event is not q for q in quiet) for event in pending)

    def commit(
        self,
        command: Callable[[Run], object],
        *,
        resumable: bytes | None = None,
        unless_signal: SignalGuard | None = None,
    ) -> object:
        """Apply `command` and append it, with everything pending, fenced.

        Returns whatever the command returned. Raises LeaseLost when the run is no longer
        this segment's, and SignalArrived (nothing appended, the command undone) when
        `unless_signal` finds its signal in the inbox (ADR 0073).
        """
        with self.lock:
            if self.lost is not None:
                raise self.lost
            checkpoint = self.run.checkpoint()
            result = command(self.run)
            self._append(checkpoint, resumable, unless_signal=unless_signal)
            return result

    def try_renew(self) -> None:
        """Append if the last confirmed append is a third of a lease old (the lease keeper
        calls this): the pending step records if any, else a `LeaseRenewed`.

        Never blocks on the agent's thread: if it is appending right now, that append is a
        heartbeat already.
        """
        if self.lost is not None or self.clock() - self.last_ok < self.timings.renew_after_s:
            return
        if self.renew_until is not None and self.clock() > self.renew_until:
            return  # past its deadline: the lease runs out and the reaper takes over
        if not self.lock.acquire(blocking=False):
            return
        try:
            # A settled run (between its settle and the keeper's untrack) or one parked for a
            # decision holds no lease any more: nothing to renew.
            if self.lost is not None or self.run.status is not RunStatus.RUNNING:
                return
            checkpoint = self.run.checkpoint()
            if not self.run.pending_events:
                self.run.renew_lease()
            try:
                if self._append(checkpoint, None, retry=False):
                    self.log.info("lease_renewed", version=self.run.version)
            except LeaseLost:
                pass  # recorded in self.lost; the agent's thread raises it at its next call
        finally:
            self.lock.release()

    def close(self) -> None:
        """The segment has ended: whatever still holds it (a step thread abandoned at its
        deadline) can append nothing more."""
        with self.lock:
            if self.lost is None:
                self.lost = LeaseLost(Outcome.LEASE_LOST, "the segment has ended")

    # -- internals -----------------------------------------------------------------------------

    def _append(
        self,
        checkpoint: Checkpoint,
        resumable: bytes | None,
        *,
        retry: bool = True,
        unless_signal: SignalGuard | None = None,
    ) -> bool:
        """Append every pending event. Returns True once they are confirmed; with
        `retry=False` a store error gives up at once (False: the events stay pending and in
        doubt, and the next append settles the doubt first) so the caller can try again
        later. Raises LeaseLost when the run is lost or the segment fenced itself."""
        delay = 0.05
        while True:
            if self._doubt is None or self._settle_doubt(checkpoint):
                batch = self.run.pending_events
                if not batch:
                    return True  # the attempt in doubt had landed, and it was all there was
                # The store's lease starts when the append got its locks, which is after it
                # was sent: timing the self-fence from the sending, not from the reply, keeps
                # the segment's idea of its lease inside the store's, however long the append
                # queued on a lock (ADR 0016).
                sent = self.clock()
                ask = self.next_claim
                try:
                    if unless_signal is not None:
                        self.store.append(
                            self.run, resumable=resumable, unless_signal=unless_signal
                        )
                    elif ask is None or self.run.status is RunStatus.RUNNING or not ask.wanted():
                        self.store.append(self.run, resumable=resumable)
                    else:
                        ask.sent = sent
                        ask.claimed = self.store.append(
                            self.run, resumable=resumable, then_claim=ask.request
                        )
                        ask.latency_s = self.clock() - sent
                except SignalArrived:
                    self.run.restore(checkpoint)
                    raise
                except VersionConflict:
                    # Never a retry of our own write: an attempt that may have landed is
                    # settled by a load before anything is sent again (ADR 0002).
                    self.run.restore(checkpoint)
                    self._lose_to_whoever_appended()
                except StoreUnavailable as error:
                    self.log.warning(
                        "store_unavailable",
                        error=type(error).__name__,
                        version=self.run.committed_version,
                    )
                    self._doubt = _Doubt(self.run.state, sent)
                    continue  # settle it now: often the store is back at once
                self.last_ok = sent
                self._quiet.clear()
                self._log_recorded(batch)
                return True
            remaining = self.last_ok + self.timings.self_fence_after_s - self.clock()
            if remaining <= 0:
                self.run.restore(checkpoint)
                self._lose(
                    Outcome.LEASE_LOST,
                    "self-fenced: the store stayed unreachable for half a lease",
                    telemetry.SELF_FENCED,
                )
            if not retry:
                return False
            self.sleep(min(delay, remaining))
            delay = min(delay * 2, 1.0)

    def _settle_doubt(self, checkpoint: Checkpoint) -> bool:
        """Did the append in doubt land? Loads the run: at the state that append would have
        left, it landed (its events are marked committed); still at our committed version,
        it did not (they stay pending, to be sent again); anything else means somebody else
        appended. Returns False while the store cannot be read. Raises LeaseLost."""
        doubt = self._doubt
        assert doubt is not None
        try:
            current = self.store.load(self.run.id)
        except StoreUnavailable:
            return False
        self._doubt = None
        if current is None:
            self.run.restore(checkpoint)
            self._lose(Outcome.LEASE_LOST, "the run no longer exists", telemetry.GONE)
        assert current is not None
        if current.version == doubt.state.version and current.state == doubt.state:
            # Counted by versions: a store that marked the run before its reply was lost
            # has already moved `committed_version`.
            count = max(0, doubt.state.version - self.run.committed_version)
            landed = self.run.pending_events[:count]
            self.run.mark_committed_first(count)
            self._log_recorded(landed)
            self.last_ok = doubt.sent
            return True
        if current.version != self.run.committed_version:
            self.run.restore(checkpoint)
            self._lose_to(current)
        return True

    def _log_recorded(self, batch: tuple[RunEvent, ...]) -> None:
        """`step_recorded` once a step's record is in the log (not when the step ended)."""
        version = self.run.committed_version - len(batch)
        for event in batch:
            version += 1
            if isinstance(event, Run.LeaseRenewed):
                self.probe.lease_renewed()
            elif isinstance(event, Run.StepRecorded):
                self.log.info(
                    "step_recorded",
                    seq=event.seq,
                    kind=event.kind,
                    step=event.name,
                    duration_ms=event.duration_ms,
                    version=version,
                    error_type=event.error_type,
                )

    def _lose_to_whoever_appended(self) -> None:
        try:
            current = self.store.load(self.run.id)
        except StoreUnavailable:
            current = None
        self._lose_to(current)

    def _lose_to(self, current: Run | None) -> None:
        if current is not None and current.status is RunStatus.CANCELLED:
            self._lose(Outcome.CANCELLED, "the run was cancelled", telemetry.CANCELLED)
        self._lose(Outcome.LEASE_LOST, "somebody else appended to the run", telemetry.TAKEN_OVER)

    def _lose(self, outcome: Outcome, why: str, cause: str) -> None:
        if self.lost is None:
            self.lost = LeaseLost(outcome, why)
            self.probe.lease_lost(cause)
            event = "run_cancel_observed" if outcome is Outcome.CANCELLED else "lease_lost"
            self.log.warning(event, version=self.run.committed_version, why=why)
        raise self.lost
