"""A segment: one stretch of execution of a run under one lease, and every append it makes.

The segment owns the in-memory `Run` (so a step never reloads or replays the run) and is the
only place its appends happen. Three rules make it safe:

* **Fencing.** Each append is fenced on the version the segment last wrote. A conflict means
  somebody else appended: the segment has lost the run. It stops at once, records nothing
  more and settles nothing; the outcome is `cancelled` if a cancel did it, else `lease_lost`.
* **Ambiguity.** A store error during an append leaves it unknown whether the append landed.
  The segment looks before it retries: its own state at its version means it landed; another
  version means it lost the run; the old version means retry.
* **Self-fencing.** Retrying stops half a lease after the last confirmed append. By then the
  segment cannot know whether the reaper is about to reclaim the run, so it gives the run up
  (`lease_lost`) and never starts another step or write (ADR 0007).

Appends come from the agent's thread and, during a long step, from the lease keeper's thread;
a lock keeps them one at a time, and the run's version orders them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from steptrail.domain.enums import Outcome, RunStatus
from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.domain.ports import RunStore
from steptrail.domain.run import Run, RunState

Clock = Callable[[], float]


class LeaseLost(BaseException):
    """The segment no longer owns its run. Derives from BaseException so that an agent's
    `except Exception` cannot swallow it and carry on acting without the lease."""

    def __init__(self, outcome: Outcome, why: str) -> None:
        super().__init__(why)
        self.outcome = outcome
        self.why = why


@dataclass(frozen=True)
class SegmentTimings:
    """Lease arithmetic of a segment, in seconds."""

    lease_s: float

    @property
    def renew_after_s(self) -> float:
        """A step running longer than this renews the lease in the background."""
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
    ) -> None:
        self.store = store
        self.run = run
        self.timings = SegmentTimings(lease_s)
        self.clock = clock
        self.sleep = sleep
        self.lock = threading.RLock()
        self.last_ok = clock()
        self.lost: LeaseLost | None = None
        self.step_started: float | None = None
        holder = run.state.holder or "?"
        self.log = log.bind(run_id=str(run.id), worker_id=holder)

    @property
    def holder(self) -> str:
        assert self.run.state.holder is not None
        return self.run.state.holder

    @property
    def fencing_token(self) -> str:
        """`<run id>:<claim version>`: unique per segment, for outside idempotency keys."""
        return f"{self.run.id}:{self.run.state.claim_version}"

    def ensure_owned(self) -> None:
        """Raise LeaseLost if the run is no longer this segment's to act on.

        Normally that is known from the last append. But if no append was confirmed for half
        a lease (the store was down, or the agent worked long between steps), the lease may
        be about to expire or gone: renew it first, and act only if that succeeds.
        """
        if self.lost is not None:
            raise self.lost
        if self.clock() - self.last_ok > self.timings.self_fence_after_s:
            with self.lock:
                before = self.run.state
                self.run.renew_lease()
                self._append(before, None, retry=False)

    def commit(self, command: Callable[[Run], object], *, resumable: bytes | None = None) -> object:
        """Apply `command` to the run and append what it triggered, fenced.

        Returns whatever the command returned. Raises LeaseLost when the run is no longer
        this segment's; the run's in-memory state then stays at the last confirmed version.
        """
        with self.lock:
            self.ensure_owned()
            before = self.run.state
            result = command(self.run)
            self._append(before, resumable)
            return result

    def try_renew(self) -> None:
        """Renew the lease if a step has run for a third of it (the lease keeper calls this).

        Never blocks on the agent's thread: if it is appending right now, that append is a
        heartbeat already.
        """
        started = self.step_started
        if started is None or self.lost is not None:
            return
        now = self.clock()
        if now - max(started, self.last_ok) < self.timings.renew_after_s:
            return
        if not self.lock.acquire(blocking=False):
            return
        try:
            if self.lost is not None:
                return
            before = self.run.state
            self.run.renew_lease()
            try:
                if self._append(before, None, retry=False):
                    self.log.info("lease_renewed", version=self.run.version)
            except LeaseLost:
                pass  # recorded in self.lost; the agent's thread raises it after the step
        finally:
            self.lock.release()

    # -- internals -----------------------------------------------------------------------------

    def _append(self, before: RunState, resumable: bytes | None, *, retry: bool = True) -> bool:
        """Append the run's pending events. Returns True once they are confirmed; with
        `retry=False` a store error gives up at once (False, pending events dropped) so the
        caller can try again later. Raises LeaseLost when the run is lost or self-fenced."""
        delay = 0.05
        while True:
            try:
                self.store.append(self.run, resumable=resumable)
            except VersionConflict:
                self.run.discard_pending(before)
                self._lose_to_whoever_appended()
            except StoreUnavailable as error:
                if self._resolve_ambiguity(before, error):
                    return True
                remaining = self.last_ok + self.timings.self_fence_after_s - self.clock()
                if remaining <= 0:
                    self.run.discard_pending(before)
                    self._lose(
                        Outcome.LEASE_LOST,
                        "self-fenced: the store stayed unreachable for half a lease",
                    )
                if not retry:
                    self.run.discard_pending(before)
                    return False
                self.sleep(min(delay, remaining))
                delay = min(delay * 2, 1.0)
                continue
            self.last_ok = self.clock()
            return True

    def _resolve_ambiguity(self, before: RunState, error: StoreUnavailable) -> bool:
        """After a failed append: did it land? True if so (and it is marked committed)."""
        self.log.warning("store_unavailable", error=type(error).__name__)
        try:
            current = self.store.load(self.run.id)
        except StoreUnavailable:
            return False
        if current is None:
            self.run.discard_pending(before)
            self._lose(Outcome.LEASE_LOST, "the run no longer exists")
        assert current is not None
        if current.version == self.run.version and current.state == self.run.state:
            self.run.mark_committed()
            self.last_ok = self.clock()
            return True
        if current.version != self.run.committed_version:
            self.run.discard_pending(before)
            self._lose_to(current)
        return False

    def _lose_to_whoever_appended(self) -> None:
        try:
            current = self.store.load(self.run.id)
        except StoreUnavailable:
            current = None
        self._lose_to(current)

    def _lose_to(self, current: Run | None) -> None:
        if current is not None and current.status is RunStatus.CANCELLED:
            self._lose(Outcome.CANCELLED, "the run was cancelled")
        self._lose(Outcome.LEASE_LOST, "somebody else appended to the run")

    def _lose(self, outcome: Outcome, why: str) -> None:
        if self.lost is None:
            self.lost = LeaseLost(outcome, why)
            event = "run_cancel_observed" if outcome is Outcome.CANCELLED else "lease_lost"
            self.log.warning(event, version=self.run.committed_version, why=why)
        raise self.lost
