"""Durable sleep and outside events, as steps of the agent (ADR 0073).

`RunContext.sleep`, `sleep_until` and `wait_event` delegate here. Each is one step call of
the agent's execution, matched against the journal like any other (kind `sleep` or `event`,
its name, no arguments: a duration computed from the clock differs on every replay and must
not make the replay diverge):

* **Replayed**: the journal has the wait's outcome at this position; it is handed back (an
  elapsed timer, the signal taken, or the timeout raised again).
* **Woken**: the run was woken from this wait (`RunState.woke` names its step): the outcome
  is recorded now as the step, and the agent goes on.
* **Live**: a signal wait whose signal is already in the inbox takes it at once. Otherwise
  the run suspends (one fenced append of `WaitStarted`, which for a signal wait reads the
  inbox with the run's row locked first) and the agent function ends here: no lease, no
  slot, no thread while it waits.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Never

from steptrail.domain.children import refuse_reserved
from steptrail.domain.enums import Outcome, WaitKind
from steptrail.domain.journal import StepCall, fingerprint
from steptrail.domain.run import Run
from steptrail.domain.waits import (
    EVENT_STEP,
    SLEEP_STEP,
    Signal,
    SignalArrived,
    SignalGuard,
    check_signal_name,
    start_wait,
    woken_at,
)
from steptrail.workers.context_parts import Suspend
from steptrail.workers.segment import LeaseLost

if TYPE_CHECKING:
    from steptrail.workers.context import RunContext

# Who an expired decision is recorded as taken by.
EXPIRED_BY = "steptrail:deadline"

# The longest wait a duration can say (about 292 years): beyond it the store's interval
# arithmetic would overflow; an agent meaning "forever" waits without a timeout.
MAX_WAIT_MS = 9_000_000_000_000


class WaitTimedOut(Exception):
    """A wait's `timeout=` passed before what it waited for arrived (ADR 0073). Catch it to
    take a fallback path; uncaught, it fails the run (it is not retried: a retry would time
    out the same way)."""

    def __init__(self, what: str, timeout: float | None) -> None:
        after = f" within {timeout:g} s" if timeout is not None else ""
        super().__init__(f"nothing arrived for the {what} wait{after}")
        self.what = what
        self.timeout = timeout


def timeout_ms(seconds: float | None) -> int | None:
    """A wait's timeout in whole milliseconds (None: none). ValueError if negative or absurd."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"a timeout is a number of seconds, not {type(seconds).__name__}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"a timeout cannot be negative or NaN: {seconds!r}")
    ms = int(seconds * 1000)
    if ms > MAX_WAIT_MS:
        raise ValueError(f"a timeout of {seconds:g} s is beyond what a store can schedule")
    return ms


def sleep(ctx: RunContext, seconds: float, name: str) -> None:
    """`ctx.sleep`: suspend for `seconds` (judged by the store's clock), then go on."""
    ms = timeout_ms(seconds)
    assert ms is not None
    call = StepCall(SLEEP_STEP, _name(name), fingerprint(None))
    if ctx._next(call) is not None:
        return
    seq = ctx.next_seq
    if ms == 0 or woken_at(ctx._segment.run.state, WaitKind.TIMER, seq, call.name):
        record_outcome(ctx, call, {"slept_ms": ms}, {"slept_ms": ms})
        return
    suspend_for(ctx, WaitKind.TIMER, seq=seq, name=call.name, ms=ms, guard=None)


def sleep_until(ctx: RunContext, when: datetime, name: str) -> None:
    """`ctx.sleep_until`: sleep until the instant `when` (timezone-aware). The duration is
    taken from this machine's clock; the wake-up is judged by the store's."""
    if when.tzinfo is None:
        raise ValueError("sleep_until needs a timezone-aware datetime (e.g. with tzinfo=UTC)")
    seconds = max(0.0, (when - datetime.now(UTC)).total_seconds())
    sleep(ctx, seconds, name)


def wait_event(ctx: RunContext, name: str, timeout: float | None) -> Any:
    """`ctx.wait_event`: the payload of the next signal named `name` delivered to this run.

    Raises WaitTimedOut when `timeout` seconds pass first."""
    check_signal_name(name)
    refuse_reserved(name)
    ms = timeout_ms(timeout)
    call = StepCall(EVENT_STEP, name, fingerprint(None))
    consumed = ctx._signals_taken
    entry = ctx._next(call)
    if entry is not None:
        value = entry.value
        if value.get("timed_out"):
            raise WaitTimedOut(f"event {name!r}", timeout)
        consumed[name] = int(value["signal"])
        return value.get("payload")
    seq = ctx.next_seq
    store = ctx._segment.store
    signal = store.next_signal(ctx.run_id, name, consumed.get(name, 0))
    if signal is not None:
        return _take(ctx, call, signal)
    if woken_at(ctx._segment.run.state, WaitKind.EVENT, seq, name):
        record_outcome(ctx, call, {"timed_out": True}, {"timed_out": True})
        raise WaitTimedOut(f"event {name!r}", timeout)
    try:
        guard = SignalGuard(name, consumed.get(name, 0))
        suspend_for(ctx, WaitKind.EVENT, seq=seq, name=name, ms=ms, guard=guard)
    except SignalArrived as arrived:  # it landed while the run was running: take it now
        return _take(ctx, call, arrived.signal)


def _take(ctx: RunContext, call: StepCall, signal: Signal) -> Any:
    """Record taking `signal` as the wait's step: its number in the log, its payload in the
    journal only (the log's record is privacy-filtered metadata, ADR 0008)."""
    payload = json.loads(signal.payload)
    ctx._signals_taken[signal.name] = signal.seq
    record_outcome(ctx, call, {"signal": signal.seq}, {"signal": signal.seq, "payload": payload})
    return payload


def record_outcome(ctx: RunContext, call: StepCall, logged: dict[str, Any], value: Any) -> None:
    """Record a wait's (or a decision's) outcome as the step at `call`: `logged` in the
    log, `value` in the journal only.

    No boundary first, and none made by it (ADR 0085): an outcome is not an effect, so
    nothing needs proving before it is recorded, and it rides (with the `Replayed` note)
    with the next append that something else makes: the next live step's boundary when a
    record of an effect is pending (or the lease needs the proof), else the step's own
    record, a suspend or the settle."""
    segment = ctx._segment
    probe = segment.probe.step_started(call.kind, call.name, ctx.next_seq)
    ctx._record(
        call=call,
        started=time.perf_counter(),
        payload=logged,
        extra=None,
        error=None,
        result=value,
        log_result=False,
        probe=probe,
        quiet=True,
    )
    probe.close()


def suspend_for(
    ctx: RunContext,
    kind: WaitKind,
    *,
    seq: int,
    name: str,
    ms: int | None,
    guard: SignalGuard | None,
    names: tuple[str, ...] = (),
) -> Never:
    """Suspend the run on a wait (one fenced append of `WaitStarted`) and end the agent
    function here; also the rate limit's long wait (workers/rate_limits.py)."""
    ctx.note_replay()

    def wait(run: Run) -> None:
        start_wait(run, kind=kind, seq=seq, name=name, timeout_ms=ms, names=names)

    segment = ctx._segment
    try:
        segment.commit(wait, unless_signal=guard)
    except LeaseLost as lost:
        # A cancel (or a takeover) won the race: the run was not suspended (as for a
        # decision, ADR 0015): first outcome wins.
        if lost.outcome is Outcome.CANCELLED:
            raise LeaseLost(Outcome.SUSPEND_FAILED, lost.why) from lost
        raise
    ctx.log.info(
        "run_waiting", waiting_for=kind.value, name=name, timeout_ms=ms, version=segment.run.version
    )
    raise Suspend(Outcome.SLEEPING if kind is WaitKind.TIMER else Outcome.AWAITING_EVENT)


def _name(name: str) -> str:
    if not isinstance(name, str) or not name or len(name) > 200 or "\x00" in name:
        raise ValueError(f"a sleep's name is 1 to 200 characters with no NUL: {name!r}")
    return name
