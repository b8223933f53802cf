"""A step's journal lookup, live run and record (ADRs 0013, 0015, 0019): split out of
`workers/context.py`, whose `_next`, `_limit`, `_run_live`, `_with_deadline` and `_record`
delegate here.

* **Run**: the step's callable runs in the agent's thread, or on a helper thread the agent
  stops waiting for at the step's deadline (Python cannot kill a thread; what it returns
  after the deadline is never recorded, and the lease keeper stops renewing for it).
* **Record**: the payload is bounded, filtered to the privacy level and capped in size
  before it is deferred onto the segment's next append; a payload that breaks a limit is
  recorded as failed with the limit's error type, in the journal too, so a replay fails
  the same way.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from steptrail.domain.journal import VALUE_WRAPPING, JournalEntry, StepCall, value_json
from steptrail.domain.limits import PayloadRejected, check_depth, check_size
from steptrail.domain.privacy import filter_payload
from steptrail.domain.run import Run
from steptrail.workers import rate_limits
from steptrail.workers.context_parts import (
    LiveStep,
    Recorded,
    RunTimedOut,
    StepTimedOut,
    _entry,
    _error_type,
    _not_awaitable,
    jsonable,
)
from steptrail.workers.telemetry import NO_STEP, StepEnd, StepProbe

if TYPE_CHECKING:
    from steptrail.workers.context import RunContext

T = TypeVar("T")


def next_entry(ctx: RunContext, call: StepCall) -> JournalEntry | None:
    """The journal's answer for this call's position (None: run it for real).

    Raises ValueError, before anything runs, for a name with a NUL character: no backend
    keeps one alike (PostgreSQL refuses it in text), and a run must not fail on one
    backend and pass on the other."""
    if "\x00" in call.name:
        raise ValueError(f"a {call.kind} step's name cannot hold a NUL character: {call.name!r}")
    if ctx._segment.lost is not None:
        raise ctx._segment.lost
    entry = ctx._journal.next(call)
    if entry is None:
        ctx.note_replay()
    else:
        ctx._segment.probe.step_replayed(call.kind, call.name, entry.seq, failed=entry.failed)
    return entry


def step_limit(ctx: RunContext, timeout: float | None) -> float | None:
    """The deadline of the next step: its own, cut to what is left of the segment's."""
    most = ctx._deadlines.max_duration
    if most is None:
        return timeout
    left = ctx._started + most - ctx._clock()
    if left <= 0:
        raise RunTimedOut(most)
    return left if timeout is None else min(timeout, left)


def run_live(ctx: RunContext, step: LiveStep, fn: Callable[[], T | Recorded[T]]) -> T:
    """Run a live step's callable (rate limit first, under its deadline if it has one) and
    record its outcome through `close_step`."""
    if step.rate is not None:
        step = rate_limits.acquire(ctx, step)
    fn = ctx.live_callable(step, fn)
    deactivate = step.probe.activate()
    try:
        # Through the context's own `_with_deadline`, as before the split: a subclass's
        # override still applies.
        outcome = fn() if step.limit is None else ctx._with_deadline(step.call.name, fn, step.limit)
        outcome = _not_awaitable(outcome, step.call.kind, step.call.name)
    except Exception as error:
        deactivate()
        ctx.close_step(step, error=error)
        raise
    except BaseException:
        deactivate()
        step.probe.close()
        raise
    deactivate()
    value: T = ctx.close_step(step, outcome=outcome)
    return value


def with_deadline(ctx: RunContext, name: str, fn: Callable[[], Any], seconds: float) -> Any:
    """Run `fn` on a helper thread and stop waiting for it after `seconds`.

    Python cannot kill a thread: a step past its deadline goes on running until it
    returns by itself, but nothing it returns is recorded, and the lease keeper stops
    renewing for a step it is still waiting on after the deadline (ADR 0015).
    """
    box: dict[str, Any] = {}
    context = contextvars.copy_context()

    def target() -> None:
        try:
            box["value"] = context.run(fn)
        except BaseException as error:  # noqa: BLE001 - re-raised in the agent's thread
            box["error"] = error

    thread = threading.Thread(target=target, name=f"steptrail-step-{name}", daemon=True)
    with ctx.renewing_until(seconds):
        thread.start()
        thread.join(seconds)
    if thread.is_alive():
        ctx.log.warning("step_timed_out", step=name, timeout_s=seconds)
        raise StepTimedOut(name, seconds)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def record(
    ctx: RunContext,
    *,
    call: StepCall,
    started: float,
    payload: Mapping[str, Any] | None,
    extra: Recorded[Any] | None,
    error: BaseException | None,
    result: Any,
    log_result: bool = True,
    probe: StepProbe = NO_STEP,
    quiet: bool = False,
) -> None:
    """Defer the step's record onto the segment's next append: bounded, filtered and capped
    as the module docstring says; raises the limit's error if the step's value broke one.
    `quiet`: the record is a wait's outcome, no effect (`Segment.defer`, ADR 0085)."""
    duration_ms = int((time.perf_counter() - started) * 1000)
    kind, name = call.kind, call.name
    body: dict[str, Any] = dict(payload or {})
    tokens, cost = 0, 0.0
    if extra is not None:
        body.update(extra.payload)
        tokens, cost = extra.tokens, extra.cost
    if error is None and log_result:
        body["content" if kind == "llm" else "result"] = result
    error_type = _error_type(error) if error is not None else None
    rejected: PayloadRejected | None = None
    try:
        # Bounded before anything else walks it (ADR 0019): what is written must be
        # readable back. A step whose payload or value is too deep or too large is
        # recorded without them, as failed with the limit's error type (in the journal
        # too, so a replay fails the same way), and the agent gets the error.
        check_depth(body, f"the payload of step {name!r}")
        if error is None and not log_result:
            # (Logged, the value sits one level down in `body`, whose check covers it.)
            check_depth(result, f"the value of step {name!r}")
        filtered = filter_payload(jsonable(body), ctx._privacy, declared_tools=ctx._declared_tools)
        ctx.check_size(filtered, f"the payload of step {name!r}")
        if error is None:
            entry = _value_entry(ctx, call, result, f"the value of step {name!r}")
        else:
            entry = _entry(call, ctx._journal.position, result, error, ctx._classify)
    except PayloadRejected as too_much:
        filtered, error_type = {"payload_rejected": True}, type(too_much).__name__
        rejected = too_much if error is None else None
        entry = _entry(call, ctx._journal.position, None, too_much, ctx._classify)

    def record(run: Run) -> int:
        return run.record_step(
            kind=kind,
            name=name,
            duration_ms=duration_ms,
            payload=filtered,
            privacy=ctx._privacy,
            error_type=error_type,
            tokens=tokens,
            cost=cost,
            journal=entry,
        )

    ctx._segment.defer(record, quiet=quiet)
    failure = entry.failure_class.value if entry.failure_class is not None else None
    probe.ended(StepEnd(ctx.next_seq - 1, filtered, tokens, cost, error_type, failure))
    if rejected is not None:
        raise rejected


def _value_entry(ctx: RunContext, call: StepCall, result: Any, what: str) -> JournalEntry:
    """The journal entry of a step that returned `result`, once its value is within the
    payload cap (PayloadTooLarge naming `what` if not). The value is made JSON-ready and
    encoded once: the cap measures the journal's own text of it (ADR 0090)."""
    value = jsonable(result)
    try:
        text = value_json(value)
    except ValueError:  # NaN or infinity: measured as before, stored as `_entry` stores it
        ctx.check_size(value, what)
        return _entry(call, ctx._journal.position, result, None, ctx._classify)
    check_size(len(text) - VALUE_WRAPPING, ctx._max_payload_bytes, what)
    return JournalEntry.of_value(ctx._journal.position, call, value, text=text)
