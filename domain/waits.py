"""Waits that end by time or by a signal: durable sleep and outside events (ADR 0073).

A run that waits releases its lease like a run waiting for a person (ADR 0015), so it holds no
worker slot. What ends the wait is one of two things, and both are claims or fenced appends
(ADR 0068):

* **its deadline**: the suspending append gives the store a duration (`timeout_ms`) and the
  store makes the run claimable at that append's instant plus it. A timer is a wait whose
  deadline is its wake-up time. The claim that takes it folds `Claimed` from the waiting
  status and remembers the wait in `RunState.woke`.
* **a signal** named as the wait names it: whoever delivers it appends `Woken` at the run's
  version in the transaction that stores the signal, which queues the run now.

Either way the woken segment replays the agent up to the wait and records the wait's outcome
there as a step (`sleep` or `event`), so a later segment replays the outcome instead of
waiting again. No instant is in an event: the deadline is the row's `available_at`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from steptrail.domain.enums import RunStatus, WaitKind
from steptrail.domain.errors import DomainError, IllegalTransition
from steptrail.domain.run import Run, RunEvent
from steptrail.domain.run_state import RunState, Waiting, released_state

# The step kinds that record a wait's outcome in the journal (and the trail).
SLEEP_STEP = "sleep"
EVENT_STEP = "event"

# A signal's name: what `wait_event` waits for and `signal` delivers (ADR 0073).
MAX_SIGNAL_NAME = 200

_STATUS = {WaitKind.TIMER: RunStatus.WAITING_FOR_TIMER, WaitKind.EVENT: RunStatus.WAITING_FOR_EVENT}


@dataclass(frozen=True)
class Signal:
    """One signal in a run's inbox: its number among the run's signals (arrival order), its
    name and its payload (canonical JSON)."""

    seq: int
    name: str
    payload: bytes


@dataclass(frozen=True)
class SignalGuard:
    """Suspend only if no signal named `name` numbered after `after_seq` is in the inbox:
    checked by the store inside the suspending append's transaction, after the run's row is
    locked, so a signal stored while the run was still running is never left unread."""

    name: str
    after_seq: int
    # A wait for any of several child runs (ADR 0075): their signals, each sent once, so
    # any of them in the inbox at all ends it; the first by arrival wins.
    names: tuple[str, ...] = ()


def guard_names(guard: SignalGuard) -> list[tuple[str, int]]:
    """(name, after seq) of every signal that satisfies `guard`."""
    return [(guard.name, guard.after_seq)] + [(name, 0) for name in guard.names]


class SignalArrived(DomainError):
    """The signal a run was about to wait for is already there; nothing was written."""

    def __init__(self, signal: Signal) -> None:
        super().__init__(f"signal {signal.name!r} #{signal.seq} is already in the inbox")
        self.signal = signal


class WaitStarted(RunEvent):
    """The run stopped to sleep (`kind` timer) or to wait for a signal named `name` (`kind`
    event); its lease is released. `seq` is the step that will record the wait's outcome;
    `timeout_ms`, when set, is how long after this event the claim may take the run back."""

    TOPIC: ClassVar[str] = "steptrail.Run.WaitStarted"
    kind: WaitKind
    seq: int
    name: str | None = None
    timeout_ms: int | None = None
    # A wait for any of several signals (`wait_any`, ADR 0075): each ends it.
    names: tuple[str, ...] = ()

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        waiting = Waiting(
            kind=self.kind,
            digest="",
            since_version=s.version + 1,
            name=self.name,
            seq=self.seq,
            timeout_ms=self.timeout_ms,
            names=self.names,
        )
        return released_state(
            s, _STATUS[self.kind], waiting=waiting, decision=None, wake_after_ms=self.timeout_ms
        )


class Woken(RunEvent):
    """A signal the run waited for was delivered: the run is queued now, and the segment that
    takes it finds the signal where the agent waits. `signal_seq` names the signal."""

    TOPIC: ClassVar[str] = "steptrail.Run.Woken"
    name: str
    signal_seq: int

    def apply(self, state: RunState | None) -> RunState:
        s = self._require(state)
        return s.evolve(
            status=RunStatus.QUEUED,
            waiting=None,
            retry_delay_ms=0,
            wake_after_ms=None,
            woke=s.waiting,
        )


def check_signal_name(name: str) -> str:
    """`name`, if it can name a signal: non-empty, printable, at most MAX_SIGNAL_NAME long."""
    if not isinstance(name, str) or not name or len(name) > MAX_SIGNAL_NAME:
        raise ValueError(f"a signal name is 1 to {MAX_SIGNAL_NAME} characters")
    if not name.isprintable() or name != name.strip():
        raise ValueError(f"a signal name must be printable with no surrounding space: {name!r}")
    return name


def start_wait(
    run: Run,
    *,
    kind: WaitKind,
    seq: int,
    name: str | None = None,
    timeout_ms: int | None = None,
    names: tuple[str, ...] = (),
) -> None:
    """The holder suspends its run until a timer or a signal ends the wait."""
    holder = run.holder("wait")
    if kind not in _STATUS:
        raise IllegalTransition(f"a {kind} wait is a decision, not a timer or a signal")
    if timeout_ms is not None and timeout_ms < 0:
        raise IllegalTransition("a wait's timeout cannot be negative")
    if kind is WaitKind.TIMER and timeout_ms is None:
        raise IllegalTransition("a timer needs its duration")
    if kind is WaitKind.EVENT:
        check_signal_name(name or "")
    for other in names:
        check_signal_name(other)
    run.trigger(
        WaitStarted(actor=holder, kind=kind, seq=seq, name=name, timeout_ms=timeout_ms, names=names)
    )


def waits_for(state: RunState, name: str) -> bool:
    """Whether delivering a signal named `name` ends the run's current wait."""
    waiting = state.waiting
    return (
        state.status is RunStatus.WAITING_FOR_EVENT
        and waiting is not None
        and (waiting.name == name or name in waiting.names)
    )


def wake(run: Run, *, actor: str, name: str, signal_seq: int) -> None:
    """Queue a run that waits for the signal `name` (delivered as `signal_seq`)."""
    if not waits_for(run.state, name):
        raise IllegalTransition(f"the run does not wait for a signal {name!r} ({run.status})")
    run.trigger(Woken(actor=actor, name=name, signal_seq=signal_seq))


def woken_at(state: RunState, kind: WaitKind, seq: int, name: str | None = None) -> bool:
    """Whether the run was woken from the wait of `kind` (and `name`) at step `seq`: the
    segment then records that wait's outcome instead of waiting again."""
    woke = state.woke
    return woke is not None and woke.kind is kind and woke.seq == seq and woke.name == name
