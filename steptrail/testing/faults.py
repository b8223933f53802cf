"""Fault injection for users' agents: crash, lose the lease, or fail at step N (ADR 0035).

A fault names the position of a live step call (the k-th step call of an execution, as the
journal numbers them) and fires once, the first time that position runs for real:

* `crash_at(n)`: the process "dies" right after step n's function returned, before its
  record is stored, as a SIGKILL would: nothing more is appended, nothing is settled. The
  run stays `running` under a lease nobody renews; the kit lets it expire (skipping time
  where the store allows) and the reaper takes the run back.
* `lose_lease_at(n)`: as step n starts (after its boundary), somebody else takes the run (a
  reaper reclaim, as when a paused worker became a zombie); the step runs as a zombie's
  would, the segment finds out at its next append and stops with `lease_lost`, and the run
  goes on from the queue.
* `fail_at(n, failure_class)`: step n raises a `ClassifiedError` of that class instead of
  running (its record says so), so the retry ladder treats it as the real failure would be.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from steptrail.domain.classifier import ClassifiedError
from steptrail.domain.enums import FailureClass
from steptrail.domain.errors import IllegalTransition, VersionConflict
from steptrail.domain.ports import ClaimedRun, ClaimRequest, RunStore
from steptrail.domain.run import Run
from steptrail.domain.waits import SignalGuard
from steptrail.workers.context import LiveStep, RunContext

T = TypeVar("T")
FAULT_ACTOR = "steptrail.testing"


class SimulatedCrash(BaseException):  # like SIGKILL: nothing may catch it and carry on
    """The testing kit's stand-in for the process dying at a step (see `crash_at`)."""

    def __init__(self, position: int) -> None:
        super().__init__(f"simulated crash at step {position}")
        self.position = position


class InjectedFailure(ClassifiedError):
    """A step failure the testing kit injected (see `fail_at`)."""


@dataclass(frozen=True)
class Fault:
    """One fault: what happens (`crash`, `lose_lease`, `fail`) at which step position."""

    kind: str
    at: int
    failure_class: FailureClass | None = None


def crash_at(step: int) -> Fault:
    """Die after step `step` ran, before its record is stored (no settle)."""
    return Fault("crash", _position(step))


def lose_lease_at(step: int) -> Fault:
    """Lose the run to a reclaim just before step `step` (a zombie worker)."""
    return Fault("lose_lease", _position(step))


def fail_at(step: int, failure_class: FailureClass | str) -> Fault:
    """Make step `step` raise an error of `failure_class` (e.g. `server_error`)."""
    return Fault("fail", _position(step), FailureClass(failure_class))


def _position(step: int) -> int:
    if step < 1:
        raise ValueError("steps are numbered from 1")
    return step


class Fuse:
    """Blown by a crash: from then on every append of the dead segment raises again."""

    def __init__(self) -> None:
        self.blown: SimulatedCrash | None = None

    def blow(self, crash: SimulatedCrash) -> SimulatedCrash:
        self.blown = crash
        return crash


class FusedStore:
    """The store as a segment of the kit sees it: appends stop once its process 'died'."""

    def __init__(self, store: RunStore, fuse: Fuse) -> None:
        self._store = store
        self._fuse = fuse

    def append(
        self,
        run: Run,
        *,
        resumable: bytes | None = None,
        then_claim: ClaimRequest | None = None,
        unless_signal: SignalGuard | None = None,
    ) -> list[ClaimedRun]:
        if self._fuse.blown is not None:
            raise self._fuse.blown
        return self._store.append(
            run, resumable=resumable, then_claim=then_claim, unless_signal=unless_signal
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class FaultPlan:
    """The faults still to fire; each fires once. Shared by every segment the kit runs."""

    def __init__(self, faults: Iterable[Fault], store: RunStore) -> None:
        self._faults = list(faults)
        self._store = store
        self._lock = threading.Lock()
        self.fuse = Fuse()
        self.fired: list[Fault] = []

    def take(self, position: int) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.at == position:
                    self._faults.remove(fault)
                    self.fired.append(fault)
                    return fault
        return None

    def steal(self, run: Run) -> None:
        """Somebody else's append to `run`: the reaper's reclaim (or, for a run that cannot
        be reclaimed, a lease renewal under another name), fenced like any append."""
        current = self._store.load(run.id)
        if current is None:
            return
        try:
            current.reclaim(actor=FAULT_ACTOR)
        except IllegalTransition:
            current.renew_lease()
        with suppress(VersionConflict):  # somebody moved it on: the lease is lost either way
            self._store.append(current)


class FaultyContext(RunContext):
    """A `RunContext` that consults the kit's fault plan before each live step's callable
    (after its boundary, and after a write's marker). The async context runs its steps
    through the same hook, so faults reach `async def` agents as they reach sync ones."""

    plan: FaultPlan

    def live_callable(self, step: LiveStep, fn: Callable[[], Any]) -> Callable[[], Any]:
        position = self._journal.position
        fault = self.plan.take(position)
        if fault is None:
            return fn
        if fault.kind == "lose_lease":
            self.plan.steal(self._segment.run)
            return fn
        if fault.kind == "fail":
            failure_class = fault.failure_class or FailureClass.UNKNOWN

            def failing() -> Any:
                raise InjectedFailure(failure_class, f"injected at step {position}")

            return failing
        fuse = self.plan.fuse

        def crashing() -> Any:
            outcome = fn()
            if inspect.isawaitable(outcome):  # an async step: die once it has finished

                async def finished() -> Any:
                    await outcome
                    raise fuse.blow(SimulatedCrash(position))

                return finished()
            raise fuse.blow(SimulatedCrash(position))

        return crashing


def context_for(plan: FaultPlan) -> type[RunContext]:
    """A context class bound to `plan`."""
    return type("BoundFaultyContext", (FaultyContext,), {"plan": plan})
