"""The one instrumentation seam of the runtime: what the core tells its observers.

The core (enqueue, the worker loop, the executor, the segment, the context) calls these hooks
at the points that matter and never knows who listens. `Telemetry` and its probes do nothing
by default, so a runtime without observers pays for a few empty method calls and nothing
else; tracing (OpenTelemetry, `steptrail.tracing`) and worker metrics (Prometheus,
`steptrail.worker_metrics`) are two implementations, composed with `Fanout` (ADR 0031).

Rules every implementation keeps:

* **Never raise into the core.** A hook that fails must not fail a run; implementations
  catch their own errors.
* **Never see content above the privacy level.** Step hooks receive the payload *after* the
  privacy filter, exactly what the log records, and error classes, never messages.
* **Probes are per segment and per step.** They may be created and ended on store threads
  (async agents); only `activate()` runs where the agent (or the step) runs, so an
  implementation that keeps thread- or task-local state (a current span) does it there.
  The lease keeper's renewals arrive from its own thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from uuid import UUID

from steptrail.domain.enums import Outcome
from steptrail.domain.ports import ClaimedRun
from steptrail.domain.run import Run

# Why a segment lost its run (label values of the lease-lost metric):
TAKEN_OVER = "taken_over"  # somebody else appended: a reclaim, another claim, a takeover
CANCELLED = "cancelled"  # a cancel landed first
SELF_FENCED = "self_fenced"  # the store stayed unreachable for half a lease (ADR 0007)
GONE = "gone"  # the run no longer exists (purged)


@dataclass(frozen=True)
class StepEnd:
    """A live step as it ended: what the log records of it, already privacy-filtered."""

    seq: int
    payload: Mapping[str, Any] = field(default_factory=dict)
    tokens: int = 0
    cost: float = 0.0
    error_type: str | None = None
    failure_class: str | None = None


def _nothing() -> None:
    return None


class StepProbe:
    """Watches one live step: `ended` when it returned or raised, then `close` (always).

    `activate` is called on the thread (or task) that runs the step's callable, around it;
    opening and closing may happen on store threads (async agents)."""

    def activate(self) -> Callable[[], None]:
        """The step is running here now; returns the undo (call it on the same thread)."""
        return _nothing

    def ended(self, end: StepEnd) -> None:
        """The step finished; `end` is what its record holds."""

    def close(self) -> None:
        """The step is over on this thread, whether or not `ended` was called."""


class SegmentProbe:
    """Watches one segment of a run, from its start under a lease to its outcome.

    `activate` is called on the thread (or task) that runs the agent, around it."""

    def activate(self) -> Callable[[], None]:
        """The agent runs here now; returns the undo (call it on the same thread/task)."""
        return _nothing

    def step_started(self, kind: str, name: str, seq: int) -> StepProbe:
        """A live step is about to run (after its boundary append); it gets sequence `seq`."""
        return NO_STEP

    def step_replayed(self, kind: str, name: str, seq: int, *, failed: bool) -> None:
        """A step call was answered from the journal (recorded as step `seq`), not run."""

    def lease_renewed(self) -> None:
        """A `LeaseRenewed` append of this segment was confirmed."""

    def lease_lost(self, cause: str) -> None:
        """The segment learned it no longer owns its run (`TAKEN_OVER`, `CANCELLED`, …)."""

    def failed(self, failure_class: str, error_type: str) -> None:
        """The agent raised; the retry ladder is about to settle the run."""

    def ended(self, outcome: Outcome | None) -> None:
        """The segment is over: its outcome, or None when steptrail itself crashed."""


class CreationProbe:
    """Watches the creation (enqueue or interactive start) of one run."""

    @property
    def trace_parent(self) -> str | None:
        """The W3C `traceparent` every segment of the run continues from (None: no trace)."""
        return None

    def ended(self, *, duplicate: bool = False) -> None:
        """The creation was written (or an idempotency key returned an existing run)."""


NO_STEP = StepProbe()
NO_SEGMENT = SegmentProbe()
NO_CREATION = CreationProbe()


class Telemetry:
    """The observers of one runtime. This base observes nothing."""

    def run_created(self, *, agent: str, run_id: UUID, how: str) -> CreationProbe:
        """A run is about to be created by `how` (`enqueue` or `start`)."""
        return NO_CREATION

    def claimed(self, runs: Sequence[ClaimedRun], seconds: float) -> None:
        """One claim round trip took `seconds` and returned `runs` (maybe none)."""

    def segment_started(self, run: Run) -> SegmentProbe:
        """A segment of `run` starts in this process, on this thread, under its lease."""
        return NO_SEGMENT

    def prepare(self) -> None:
        """Make now whatever this observer would make on first use (imports included), so
        that a process can do it before it arms its signal handlers."""


NO_TELEMETRY = Telemetry()


class Fanout(Telemetry):
    """Several observers behind one: each hook goes to each of them, in order."""

    def __init__(self, members: Sequence[Telemetry]) -> None:
        self.members = tuple(members)

    def run_created(self, *, agent: str, run_id: UUID, how: str) -> CreationProbe:
        probes = [m.run_created(agent=agent, run_id=run_id, how=how) for m in self.members]
        return _FanoutCreation([p for p in probes if p is not NO_CREATION])

    def claimed(self, runs: Sequence[ClaimedRun], seconds: float) -> None:
        for member in self.members:
            member.claimed(runs, seconds)

    def segment_started(self, run: Run) -> SegmentProbe:
        probes = [m.segment_started(run) for m in self.members]
        live = [p for p in probes if p is not NO_SEGMENT]
        if not live:
            return NO_SEGMENT
        return live[0] if len(live) == 1 else _FanoutSegment(live)

    def prepare(self) -> None:
        for member in self.members:
            member.prepare()


T = TypeVar("T", bound=Telemetry)


class Deferred(Telemetry, Generic[T]):
    """An observer made when it is first needed, so that a runtime that never creates, claims
    or runs anything (a read command) does not import what it is made of (ADR 0051).

    `make` is called once, on the first call of one of `hooks` (or of `made`); the hooks not
    named are the base's no-ops and never make it, so `hooks` must name every hook the made
    observer overrides."""

    def __init__(self, make: Callable[[], T], hooks: Collection[str]) -> None:
        unknown = set(hooks) - {"run_created", "claimed", "segment_started"}
        if unknown:
            raise ValueError(f"not telemetry hooks: {sorted(unknown)}")
        self._make = make
        self._hooks = frozenset(hooks)
        self._made: T | None = None
        self._lock = threading.Lock()

    def made(self) -> T:
        """The observer, made now if it was not yet."""
        if self._made is None:
            with self._lock:
                if self._made is None:
                    self._made = self._make()
        return self._made

    def prepare(self) -> None:
        self.made().prepare()

    def run_created(self, *, agent: str, run_id: UUID, how: str) -> CreationProbe:
        if "run_created" not in self._hooks:
            return NO_CREATION
        return self.made().run_created(agent=agent, run_id=run_id, how=how)

    def claimed(self, runs: Sequence[ClaimedRun], seconds: float) -> None:
        if "claimed" in self._hooks:
            self.made().claimed(runs, seconds)

    def segment_started(self, run: Run) -> SegmentProbe:
        if "segment_started" not in self._hooks:
            return NO_SEGMENT
        return self.made().segment_started(run)


def compose(*members: Telemetry | None) -> Telemetry:
    """One observer for all of `members` (None and no-op members are left out)."""
    live = [m for m in members if m is not None and m is not NO_TELEMETRY]
    if not live:
        return NO_TELEMETRY
    return live[0] if len(live) == 1 else Fanout(live)


class _FanoutCreation(CreationProbe):
    def __init__(self, probes: list[CreationProbe]) -> None:
        self.probes = probes

    @property
    def trace_parent(self) -> str | None:
        for probe in self.probes:
            if probe.trace_parent is not None:
                return probe.trace_parent
        return None

    def ended(self, *, duplicate: bool = False) -> None:
        for probe in self.probes:
            probe.ended(duplicate=duplicate)


def _activate_all(probes: Sequence[StepProbe | SegmentProbe]) -> Callable[[], None]:
    undo = [p.activate() for p in probes]

    def deactivate() -> None:
        for step in reversed(undo):
            step()

    return deactivate


class _FanoutStep(StepProbe):
    def __init__(self, probes: list[StepProbe]) -> None:
        self.probes = probes

    def activate(self) -> Callable[[], None]:
        return _activate_all(self.probes)

    def ended(self, end: StepEnd) -> None:
        for probe in self.probes:
            probe.ended(end)

    def close(self) -> None:
        # Reverse order: a tracer that made its span current restores the context last.
        for probe in reversed(self.probes):
            probe.close()


class _FanoutSegment(SegmentProbe):
    def __init__(self, probes: list[SegmentProbe]) -> None:
        self.probes = probes

    def activate(self) -> Callable[[], None]:
        return _activate_all(self.probes)

    def step_started(self, kind: str, name: str, seq: int) -> StepProbe:
        # A member that does not watch steps (a tracer whose segment does not record) is
        # left out, as `Fanout.segment_started` leaves out a segment no member watches.
        probes = [p.step_started(kind, name, seq) for p in self.probes]
        live = [p for p in probes if p is not NO_STEP]
        if not live:
            return NO_STEP
        return live[0] if len(live) == 1 else _FanoutStep(live)

    def step_replayed(self, kind: str, name: str, seq: int, *, failed: bool) -> None:
        for probe in self.probes:
            probe.step_replayed(kind, name, seq, failed=failed)

    def lease_renewed(self) -> None:
        for probe in self.probes:
            probe.lease_renewed()

    def lease_lost(self, cause: str) -> None:
        for probe in self.probes:
            probe.lease_lost(cause)

    def failed(self, failure_class: str, error_type: str) -> None:
        for probe in self.probes:
            probe.failed(failure_class, error_type)

    def ended(self, outcome: Outcome | None) -> None:
        for probe in reversed(self.probes):
            probe.ended(outcome)
