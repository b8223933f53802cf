"""What an agent sees of its run: `RunContext`, the handle for recording steps and tools.

Every recorded step is an append fenced on the run's version, and so also the heartbeat. A
step's callable runs first and is recorded after it returns (or raises); if the record
cannot be appended because the run was lost or cancelled, `LeaseLost` propagates and the
agent stops with nothing more recorded. Before a write tool runs, a pending-effect marker is
appended under the same fence; a write tool never runs without it.

Durable replay (ADR 0013): each step's verbatim outcome is journaled with its record, and a
later segment of the run hands recorded outcomes back by position instead of running the
steps again (`JournalCursor` holds the rule). A write tool's result is appended the moment
it returns, so a finished write is as durable as its marker (ADR 0014). A step with a
deadline runs on a helper thread the agent stops waiting for at the deadline (ADR 0015).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from pydantic import BaseModel

from steptrail.domain.classifier import classify
from steptrail.domain.decisions import (
    DENIED,
    PendingCall,
    ResumableState,
    calls_digest,
    state_digest,
)
from steptrail.domain.enums import (
    Effect,
    FailureClass,
    PrivacyLevel,
    WaitKind,
)
from steptrail.domain.journal import (
    JournalCursor,
    JournalEntry,
    NonDeterministic,
    StepCall,
    fingerprint,
)
from steptrail.domain.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    check_size,
    json_size,
)
from steptrail.domain.privacy import tool_label
from steptrail.domain.rate_limits import RateLimit
from steptrail.domain.run import Decision
from steptrail.domain.schemas import check_schema
from steptrail.workers import children, decision_steps, rate_limits, steps, waits
from steptrail.workers.context_parts import (  # re-exported: split out (ADR 0073)
    AwaitableInSyncStep,
    CallResult,
    Deadlines,
    LiveStep,
    Recorded,
    Replayed,
    Resumption,
    RunFailed,
    RunTimedOut,
    StepTimedOut,
    Suspend,
    _bind,
    _replayed,
    _unwrap,
    denied_result,
    discard_awaitable,
    jsonable,
)
from steptrail.workers.segment import LeaseLost, Segment
from steptrail.workers.telemetry import NO_STEP, StepProbe

__all__ = [
    "AwaitableInSyncStep",
    "CallResult",
    "Deadlines",
    "LiveStep",
    "Recorded",
    "Replayed",
    "Resumption",
    "RunContext",
    "RunFailed",
    "RunTimedOut",
    "StepTimedOut",
    "Suspend",
    "denied_result",
    "discard_awaitable",
    "jsonable",
]

T = TypeVar("T")


class RunContext:
    """The agent's handle on its run. Not thread-safe: use it from the agent's thread."""

    def __init__(
        self,
        segment: Segment,
        *,
        request: dict[str, Any],
        privacy: PrivacyLevel,
        effect_of: Callable[[str], Effect],
        resumable: dict[str, Any] | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        declared_tools: frozenset[str] | None = None,
        journal: JournalCursor | None = None,
        classify: Callable[[BaseException], FailureClass] = classify,
        deadlines: Deadlines | None = None,
        clock: Callable[[], float] = time.monotonic,
        rate_limits: Mapping[str, RateLimit] | None = None,
        spawner: children.Spawner | None = None,
    ) -> None:
        self._segment = segment
        self._rate_limits = rate_limits or {}
        self._spawner = spawner
        self._declared_tools = declared_tools
        self._max_payload_bytes = max_payload_bytes
        self._privacy = privacy
        self._effect_of = effect_of
        self._journal = journal or JournalCursor()
        self._classify = classify
        self._deadlines = deadlines or Deadlines()
        self._clock = clock
        self._started = clock()
        self._replay_noted = False
        self._taken: Resumption | None = None
        self._by_hand = False
        # The last signal taken of each name in this execution: the next wait for that name
        # takes the first one after it (ADR 0073).
        self._signals_taken: dict[str, int] = {}
        self.request = request
        self.resumable = resumable
        self.log = segment.log
        if self._deadlines.max_duration is not None:
            segment.renew_until = self._started + self._deadlines.max_duration

    # -- what the agent can read ---------------------------------------------------------------

    @property
    def run_id(self) -> UUID:
        return self._segment.run.id

    @property
    def agent(self) -> str:
        return self._segment.run.state.agent

    @property
    def attempt(self) -> int:
        """1 for the first execution; each requeue or reclaim adds one."""
        return self._segment.run.state.requeue_count + 1

    @property
    def fencing_token(self) -> str:
        """`<run id>:<claim version>`, unique to this segment: use it (with the step number)
        as the idempotency key of calls to the outside world."""
        return self._segment.fencing_token

    @property
    def next_seq(self) -> int:
        """The sequence number the next step will be recorded under."""
        return self._segment.run.state.steps + 1

    @property
    def idempotency_key(self) -> str:
        """`<run id>:<position>` of the step call now running (or the last one): the same
        in every execution of that step, unlike `fencing_token`. Hand it to the outside
        system of an `idempotent_write` tool, which may run again after a crash (ADR 0014)."""
        return f"{self.run_id}:{self._journal.position}"

    @property
    def replayed(self) -> int:
        """How many step calls of this segment were answered from the journal so far."""
        return self._journal.replayed

    @property
    def diverged(self) -> NonDeterministic | None:
        """The replay mismatch this segment hit, if any (the run fails non_deterministic)."""
        return self._journal.diverged

    @property
    def decision(self) -> Decision | None:
        """The human decision this segment resumed with, if it is a resumed segment."""
        return self._segment.run.state.decision

    @property
    def privacy(self) -> PrivacyLevel:
        return self._privacy

    @property
    def resumed(self) -> Resumption | None:
        """Set when this segment resumes a run after a person decided; None otherwise.

        Reading it before the first step call means the agent resumes by hand (it skips
        what it did before suspending), so this segment does not replay the journal: its
        step calls no longer line up with the recorded positions (ADR 0013).
        """
        resumption = self._resumption()
        if resumption is not None and self._journal.untouched:
            self._journal.go_live(self._segment.run.state.steps)
            self._by_hand = True
        return resumption

    def _resumption(self) -> Resumption | None:
        decision = self.decision
        if decision is None or self.resumable is None:
            return None
        saved = ResumableState.model_validate(self.resumable)
        return Resumption(
            kind=decision.kind,
            approved=decision.approved,
            by=decision.by,
            calls=saved.calls,
            conversation=saved.conversation,
            values=saved.values,
        )

    # -- waiting for time and for outside events (ADR 0073) ------------------------------------

    def sleep(self, seconds: float, *, name: str = "sleep") -> None:
        """Suspend the run for `seconds` (judged by the store's clock) and go on after.

        The run releases its lease and worker slot while it sleeps; a worker claims it when
        the time comes, replays the steps before this call and continues after it. Recorded
        as a `sleep` step, so a later segment does not sleep again. `sleep(0)` only records.
        """
        waits.sleep(self, seconds, name)

    def sleep_until(self, when: datetime, *, name: str = "sleep") -> None:
        """`sleep` until the timezone-aware instant `when` (at once if it has passed)."""
        waits.sleep_until(self, when, name)

    def wait_event(self, name: str, *, timeout: float | None = None) -> Any:
        """The payload of the next signal named `name` delivered to this run
        (`rt.signal`, `steptrail signal`, the console), waiting for it if none is there.

        Signals delivered before the wait are kept, in order: each wait for a name takes the
        next one. While it waits the run holds no lease and no slot.

        Raises:
            WaitTimedOut: `timeout` seconds passed first (recorded: a later segment raises
                it again rather than waiting).
        """
        return waits.wait_event(self, name, timeout)

    # -- child runs (ADR 0075) ------------------------------------------------------------------

    def start_child(
        self, agent: str, request: Mapping[str, Any] | None = None, *, key: str | None = None
    ) -> children.ChildHandle:
        """Start a run of `agent` as this run's child, exactly once however often this run
        replays or crashes (a `child` step; `key` names it among its siblings, else its step
        position does). It goes on this run's queue and keeps this run's privacy level
        where that is stricter. Returns its handle for `wait_child`, `wait_all`, `wait_any`.

        Raises:
            UnknownAgent, InvalidRequest: before anything is written.
        """
        return children.start_child(self, agent, request, key)

    def wait_child(self, handle: children.ChildHandle, *, timeout: float | None = None) -> Any:
        """The child's result, waiting (no lease, no slot) until it settles.

        Raises:
            ChildFailed: the child failed for good or was cancelled (its failure class and
                reason on the exception).
            WaitTimedOut: `timeout` seconds passed first.
        """
        return children.wait_child(self, handle, timeout)

    def wait_all(
        self, handles: Sequence[children.ChildHandle], *, timeout: float | None = None
    ) -> list[Any]:
        """Every child's result, in the handles' order (`wait_child` on each in turn, each
        wait bounded by `timeout`). Raises ChildFailed for the first that did not complete."""
        return children.wait_all(self, handles, timeout)

    def wait_any(
        self, handles: Sequence[children.ChildHandle], *, timeout: float | None = None
    ) -> tuple[children.ChildHandle, Any]:
        """The first of the children to settle and its result (ChildFailed if it did not
        complete; WaitTimedOut after `timeout` seconds)."""
        return children.wait_any(self, handles, timeout)

    # -- waiting for a person ------------------------------------------------------------------

    def request_approval(
        self,
        calls: Sequence[PendingCall | Mapping[str, Any]],
        *,
        conversation: Any = None,
        timeout: float | None = None,
    ) -> Resumption:
        """Wait until a person approves or denies `calls`; returns the decision.

        The first time, the pending calls and `conversation` are saved verbatim (whatever
        the privacy level), the lease is released and the agent function ends here. After
        the decision it is called again; its steps up to this point replay from the journal
        and this call returns the decision (`approved`, `by`, `calls`): run the calls with
        `ctx.run_pending(...)`. Taking the decision is recorded as a `decision` step, so a
        later segment replays it too. (Agents that read `ctx.resumed` first resume by hand
        instead, as before.)

        With `timeout` (seconds), a decision nobody took by then expires: the run is woken
        and this call returns a denial with `expired=True` (ADR 0073); a decision sent after
        the expiry is refused.
        """
        pending = [PendingCall.model_validate(c) for c in calls]
        if not pending:
            raise ValueError("request_approval needs at least one pending call")
        state = ResumableState(kind=WaitKind.APPROVAL, calls=pending, conversation=conversation)
        labels = tuple(self.tool_label(c.name) for c in pending)
        return decision_steps.await_decision(self, state, calls_digest(pending), labels, timeout)

    def request_input(
        self,
        schema: type[BaseModel] | Mapping[str, Any],
        *,
        prompt: str | None = None,
        conversation: Any = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Wait until a person submits values matching `schema` (a pydantic model or a JSON
        Schema); returns the validated values, like `request_approval` returns a decision
        (they are also `ctx.resumed.values` for agents that resume by hand).

        Raises:
            InvalidSchema: the schema is invalid, refers outside itself or is too large
                (ADR 0020); the run is not suspended, and fails unless the agent handles it.
            WaitTimedOut: nobody submitted input within `timeout` seconds (ADR 0073).
        """
        json_schema = check_schema(
            schema.model_json_schema()
            if isinstance(schema, type) and issubclass(schema, BaseModel)
            else schema
        )
        state = ResumableState(
            kind=WaitKind.INPUT,
            input_schema=json_schema,
            prompt=prompt,
            conversation=conversation,
        )
        taken = decision_steps.await_decision(self, state, state_digest(state), (), timeout)
        if taken.expired:
            raise waits.WaitTimedOut(WaitKind.INPUT.value, timeout)
        return dict(taken.values or {})

    def run_pending(
        self, tools: Mapping[str, Callable[..., Any]] | Callable[[PendingCall], Any]
    ) -> list[CallResult]:
        """Resolve the calls this segment resumed with.

        Approved: each call runs as a tool step (`ctx.tool`, so write tools get their
        pending-effect marker first), with `tools[name](**arguments)` or `tools(call)`.
        Denied: no call runs; each gets the error result "denied by the operator", recorded
        as a step, and the agent goes on.
        """
        results = []
        for call, run in self.pending_calls(tools):
            if run is None:
                label = self.tool_label(call.name)
                self.step("tool", label, denied_result, payload={"tool": label})
                results.append(CallResult(call=call, error=DENIED))
                continue
            value = self.tool(call.name, run, arguments=call.arguments)
            results.append(CallResult(call=call, value=value))
        return results

    def pending_calls(
        self, tools: Mapping[str, Callable[..., Any]] | Callable[[PendingCall], Any]
    ) -> list[tuple[PendingCall, Callable[[], Any] | None]]:
        """The calls this segment resumed with, each with what runs it (None: denied)."""
        resumed = self._taken or self.resumed
        if resumed is None or resumed.kind is not WaitKind.APPROVAL:
            raise RuntimeError("run_pending is for a segment resumed after an approval")
        return [(c, _bind(tools, c) if resumed.approved else None) for c in resumed.calls]

    # -- steps ---------------------------------------------------------------------------------

    def step(
        self,
        kind: str,
        name: str,
        fn: Callable[[], T | Recorded[T]],
        *,
        payload: Mapping[str, Any] | None = None,
        args: Any = None,
        timeout: float | None = None,
        limit: str | None = None,
        tokens: int | None = None,
    ) -> T:
        """Run `fn` as the next step and record it (kind, name, duration, payload, result).

        If the journal already holds this step's outcome (a later segment of the run), the
        recorded value is returned, or the recorded error raised again as `ReplayedError`,
        without calling `fn`. The call must match the recorded one: same kind, name and
        fingerprint of `args` (default: of `payload`), else `NonDeterministic` is raised and
        the run fails. Values come back through JSON: return JSON-compatible data.

        Otherwise, first the step boundary: whatever is pending (the previous step's record)
        is appended, fenced, so `fn` only runs while the run is provably this segment's. The
        step's own record and journal entry are appended at the next boundary (the next
        step, a write tool, or the settle). If `fn` raises, the step is recorded with the
        exception's class (never its message; the journal keeps both) and the exception goes
        on. With a `timeout` (or a default from the App), `fn` runs on a helper thread and
        `StepTimedOut` is raised at the deadline; `fn` must not use `ctx`.

        With `limit` (an `App.rate_limit`), a live step first takes a grant of that limit
        for itself and `tokens` estimated tokens, waiting (or suspending) until the window
        allows; `Recorded(value, tokens=n)` corrects the estimate (ADR 0080).

        Raises:
            LeaseLost: the run was lost or cancelled; nothing more may be recorded.
        """
        opened = self.open_step(
            kind, name, payload=payload, args=args, timeout=timeout, limit=limit, tokens=tokens
        )
        if isinstance(opened, Replayed):
            return opened.value  # type: ignore[no-any-return]
        return self._run_live(opened, fn)

    def llm(
        self,
        name: str,
        fn: Callable[[], T | Recorded[T]],
        *,
        payload: Mapping[str, Any] | None = None,
        args: Any = None,
        timeout: float | None = None,
        limit: str | None = None,
        tokens: int | None = None,
    ) -> T:
        """`step("llm", …)`: a model call; its return value is recorded as `content`.
        `limit` and `tokens`: its rate limit and estimate (see `step`)."""
        return self.step(
            "llm", name, fn, payload=payload, args=args, timeout=timeout, limit=limit, tokens=tokens
        )

    def tool(
        self,
        name: str,
        fn: Callable[[], T | Recorded[T]],
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        limit: str | None = None,
        tokens: int | None = None,
    ) -> T:
        """Run tool `name` as the next step, honouring its declared effect.

        A tool whose outcome the journal holds is not run again, whatever its effect: its
        recorded result is returned (matched on name and `arguments`). Otherwise a write
        tool (idempotent or not, or any tool nobody declared) first appends a pending-effect
        marker under the lease; only once that is confirmed does `fn` run, and its result is
        appended (with its journal entry) as soon as it returns, not at the next boundary,
        so a finished write is never left unrecorded by a later crash (ADR 0014). The
        marker is cleared by that record; if the tool raises, the marker stays, because
        the write may have happened.

        `limit` and `tokens`: its rate limit and estimate, as for `step`; a write tool's
        marker is appended only once the grant is given (ADR 0083).
        """
        opened = self.open_tool(
            name, arguments=arguments, timeout=timeout, limit=limit, tokens=tokens
        )
        if isinstance(opened, Replayed):
            return opened.value  # type: ignore[no-any-return]
        return self._run_live(opened, fn)

    # The halves of a step, shared by this context and the async one (workers/
    # async_context.py), which runs them on a store thread and awaits the step's callable
    # between them: one implementation of replay, boundaries, markers, fencing, deadlines
    # and records for both (ADR 0022).

    def open_step(
        self,
        kind: str,
        name: str,
        *,
        payload: Mapping[str, Any] | None = None,
        args: Any = None,
        timeout: float | None = None,
        limit: str | None = None,
        tokens: int | None = None,
    ) -> LiveStep | Replayed:
        """Everything before a step's callable runs: its journal entry if it has one
        (`Replayed`; a recorded error is raised again as `ReplayedError`), else the step
        boundary, fenced, and the step's deadline (`LiveStep`).

        Raises:
            LeaseLost: the run is no longer this segment's.
            NonDeterministic: the journal recorded another step at this position.
            ReplayedError: the recorded step had raised; raised again.
            RunTimedOut: the segment is past its `max_duration`.
            InvalidRateLimit, UnknownRateLimit: `limit`/`tokens` refused (nothing written).
        """
        rate = rate_limits.claim(self._rate_limits, limit, tokens)
        call = StepCall(kind, name, fingerprint(jsonable(args if args is not None else payload)))
        entry = self._next(call)
        if entry is not None:
            return Replayed(_replayed(entry))
        deadline = timeout if timeout is not None else self._deadlines.step_timeout
        self._segment.boundary()
        deadline = self._limit(deadline)
        probe = self._segment.probe.step_started(kind, name, self.next_seq)
        return LiveStep(call, payload, deadline, time.perf_counter(), probe=probe, rate=rate)

    def open_tool(
        self,
        name: str,
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        limit: str | None = None,
        tokens: int | None = None,
    ) -> LiveStep | Replayed:
        """`open_step` for tool `name`: a write tool's pending-effect marker is appended
        and confirmed here, before its callable may run; for a rate-limited write, only
        once its grant is given (`mark_pending`, ADR 0083)."""
        rate = rate_limits.claim(self._rate_limits, limit, tokens)
        # What the log, the journal and log lines call the tool: a name the request may have
        # chosen is free text, labelled below `redacted` unless the app declared it (ADR
        # 0019). The label is a pure function of the name and the privacy level, so a replay
        # at the same level matches it.
        label = self.tool_label(name)
        call = StepCall("tool", label, fingerprint(jsonable(dict(arguments or {}))))
        entry = self._next(call)
        if entry is not None:
            return Replayed(_replayed(entry))
        effect = self._effect_of(name)
        payload: dict[str, Any] = {"tool": label, "effect": effect.value}
        if arguments is not None:
            payload["arguments"] = dict(arguments)
        deadline = timeout
        if deadline is None:
            deadline = self._deadlines.tool_timeout(name)
        if deadline is None:
            deadline = self._deadlines.step_timeout
        if not effect.is_write or rate is not None:
            # A rate-limited write passes the boundary now and appends its marker only once
            # granted: a run waiting for its window holds no marker (ADR 0083).
            self._segment.boundary()
            deadline = self._limit(deadline)
            probe = self._segment.probe.step_started("tool", label, self.next_seq)
            marker = effect if effect.is_write else None
            started = time.perf_counter()
            write = effect.is_write
            return LiveStep(
                call, payload, deadline, started, write=write, probe=probe, rate=rate, marker=marker
            )
        # The deadline is known before the marker: a run out of time never leaves a marker
        # for a write that did not start.
        deadline = self._limit(deadline)
        self._mark(label, effect)
        probe = self._segment.probe.step_started("tool", label, self.next_seq)
        return LiveStep(call, payload, deadline, time.perf_counter(), write=True, probe=probe)

    def mark_pending(self, step: LiveStep) -> LiveStep:
        """A granted, rate-limited write tool's pending-effect marker, appended and
        confirmed before its callable may run (ADR 0083); `step` unchanged otherwise."""
        if step.marker is None:
            return step
        self._mark(step.call.name, step.marker)
        return replace(step, marker=None, started=time.perf_counter())

    def _mark(self, label: str, effect: Effect) -> None:
        seq = self._segment.commit(lambda run: run.mark_effect_pending(tool=label, effect=effect))
        version = self._segment.run.version
        self.log.info("effect_pending", tool=label, effect=effect.value, seq=seq, version=version)

    def close_step(
        self, step: LiveStep, *, outcome: Any = None, error: BaseException | None = None
    ) -> Any:
        """Everything after a live step's callable returned `outcome` or raised `error`:
        its record and journal entry (appended at the next boundary, or now for a write
        tool, ADR 0014). Returns the value the agent gets (`outcome` without `Recorded`)."""
        value, extra = (None, None) if error is not None else _unwrap(outcome)
        if step.rate is not None:
            rate_limits.settle(self, step.rate, extra, error)
        try:
            # May raise PayloadRejected after recording the step as rejected (ADR 0019).
            self._record(
                call=step.call,
                started=step.started,
                payload=step.payload,
                extra=extra,
                error=error,
                result=value,
                probe=step.probe,
            )
        finally:
            step.probe.close()
            if step.write:
                # A write's record is appended now, whatever it says: its result (which
                # clears the marker), its error or its rejection (the marker stays).
                self._segment.boundary()
        return value

    def close_step_nowait(
        self, step: LiveStep, *, outcome: Any = None, error: BaseException | None = None
    ) -> tuple[bool, Any]:
        """`close_step` now if it needs no store call (not a write) and nobody holds the
        segment (the lease keeper may be appending): `(True, value)`. Otherwise `(False,
        None)` with nothing done: call `close_step` where blocking is fine. The async context
        uses this to skip a thread hand-off for most steps without ever blocking its loop."""
        lock = self._segment.lock
        if step.write or step.rate is not None or not lock.acquire(blocking=False):
            return False, None
        try:
            return True, self.close_step(step, outcome=outcome, error=error)
        finally:
            lock.release()

    @contextmanager
    def renewing_until(self, seconds: float) -> Iterator[None]:
        """While a step with a deadline `seconds` away runs, the lease keeper renews only
        until that deadline (ADR 0015)."""
        segment = self._segment
        outer = segment.renew_until
        deadline = self._clock() + seconds
        segment.renew_until = deadline if outer is None else min(outer, deadline)
        try:
            yield
        finally:
            segment.renew_until = outer

    def tool_label(self, name: str) -> str:
        """How tool `name` appears in this run's log at its privacy level."""
        return tool_label(name, self._privacy, self._declared_tools)

    def heartbeat(self) -> None:
        """Prove the run is still ours now: append what is pending, or renew the lease.
        (The lease keeper does this on its own a third of the way to expiry.)"""
        segment = self._segment
        with segment.lock:
            if segment.run.pending_events:
                segment.boundary()
            else:
                segment.commit(lambda run: run.renew_lease())

    def fence(self) -> None:
        """A step boundary that starts no step: append what is pending now, fenced on the
        run's version. An integration calls it before it lets something outside the
        journal (a framework's checkpoint) count as done.

        Raises:
            LeaseLost: the run is no longer this segment's.
        """
        self._segment.boundary()

    def note_replay(self) -> None:
        """Put a `Replayed` event in the trail once replay is over (it rides with the next
        append). Called before the first live step, and before the segment settles or
        suspends."""
        if self._replay_noted or self._journal.replayed == 0:
            return
        self._replay_noted = True
        count, last_seq = self._journal.replayed, self._journal.last_seq
        try:
            self._segment.defer(
                lambda run: run.record_replay(count=count, last_seq=last_seq), quiet=True
            )
        except LeaseLost:
            return  # the caller's next append reports the loss
        version = self._segment.run.committed_version
        self.log.info("steps_replayed", count=count, last_seq=last_seq, version=version)

    # -- internals -----------------------------------------------------------------------------

    def _next(self, call: StepCall) -> JournalEntry | None:
        """The journal's answer for this call's position (None: run it); `steps.next_entry`."""
        return steps.next_entry(self, call)

    def live_callable(self, step: LiveStep, fn: Callable[[], Any]) -> Callable[[], Any]:
        """What a live step runs: `fn` itself. The testing kit's context wraps it to inject
        faults; both this context and the async one call it, so a fault reaches sync and
        async agents alike (ADR 0074)."""
        return fn

    def _run_live(self, step: LiveStep, fn: Callable[[], T | Recorded[T]]) -> T:
        return steps.run_live(self, step, fn)

    def _limit(self, timeout: float | None) -> float | None:
        """The next step's deadline, cut to the segment's (`steps.step_limit`)."""
        return steps.step_limit(self, timeout)

    def _with_deadline(self, name: str, fn: Callable[[], Any], seconds: float) -> Any:
        """Run `fn` on a helper thread and stop waiting for it after `seconds` (ADR 0015;
        `steps.with_deadline`)."""
        return steps.with_deadline(self, name, fn, seconds)

    def _record(
        self,
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
        """Defer the step's record onto the segment's next append (`steps.record`)."""
        steps.record(
            self,
            call=call,
            started=started,
            payload=payload,
            extra=extra,
            error=error,
            result=result,
            log_result=log_result,
            probe=probe,
            quiet=quiet,
        )

    def check_size(self, payload: Any, what: str) -> None:
        """Raise PayloadTooLarge if `payload` (JSON-ready) is over the payload cap."""
        check_size(json_size(payload), self._max_payload_bytes, what)
