"""The `Run` aggregate: one durable agent run, folded from its append-only events.

A run's events are the truth. `RunState` is what folding them yields; `Run` wraps a state with
the commands that are legal in it. A command checks its guard first and raises
`IllegalTransition` with nothing recorded, or triggers exactly the events that describe what
happened, applies them, and keeps them as pending until the store has recorded them.

Two things are deliberately absent here:

* **Clocks.** Events carry durations (`lease_ms`, `delay_ms`), never instants. The instant an
  event happened is the store's clock at commit (`recorded_at`), so every deadline is judged by
  one clock no matter which machine appended (ADR 0003).
* **Locks.** Fencing is the aggregate version. A segment appends at the version it last wrote;
  anybody else's append in between (a reclaim, a cancel, another claim) makes that append
  conflict in the store, which is how a worker learns it lost the run (ADR 0002).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias
from uuid import UUID

from steptrail.domain import run_events, run_wait_events
from steptrail.domain.enums import (
    Effect,
    FailureClass,
    PrivacyLevel,
    RetryMode,
    RunStatus,
    Segment,
    TerminationReason,
    WaitKind,
)
from steptrail.domain.errors import DigestMismatch, IllegalTransition, PendingWrite
from steptrail.domain.journal import JournalEntry
from steptrail.domain.run_state import (
    DECISION_STEP,
    EVENT_TYPES,
    Decision,
    PendingEffect,
    RunEvent,
    RunState,
    Waiting,
    apply,
    fold,
    trace_id_of,
)

__all__ = [
    "DECISION_STEP",
    "EVENT_TYPES",
    "Checkpoint",
    "Decision",
    "PendingEffect",
    "Run",
    "RunEvent",
    "RunState",
    "Waiting",
    "apply",
    "fold",
    "trace_id_of",
]


class Run:
    """A run and the commands that move it. Construct with `enqueue`, `start` or `replay`."""

    # -- events (defined by lifecycle in run_events and run_wait_events) ---------------------

    Queued: TypeAlias = run_events.Queued
    Started: TypeAlias = run_events.Started
    Claimed: TypeAlias = run_events.Claimed
    StepRecorded: TypeAlias = run_events.StepRecorded
    Replayed: TypeAlias = run_events.Replayed
    LeaseRenewed: TypeAlias = run_events.LeaseRenewed
    EffectPending: TypeAlias = run_events.EffectPending
    Completed: TypeAlias = run_events.Completed
    Failed: TypeAlias = run_events.Failed
    Cancelled: TypeAlias = run_events.Cancelled
    Requeued: TypeAlias = run_events.Requeued
    Reclaimed: TypeAlias = run_events.Reclaimed
    DeadLettered: TypeAlias = run_events.DeadLettered
    Suspended: TypeAlias = run_wait_events.Suspended
    Decided: TypeAlias = run_wait_events.Decided
    Resumed: TypeAlias = run_wait_events.Resumed
    Released: TypeAlias = run_wait_events.Released
    Retried: TypeAlias = run_wait_events.Retried

    # -- construction --------------------------------------------------------------------------

    def __init__(self, state: RunState) -> None:
        self._state = state
        self._committed_version = state.version
        self._pending: list[RunEvent] = []
        self._pending_journal: list[tuple[int, JournalEntry]] = []
        # What a settling child run hands its parent (its verbatim result; ADR 0075): never
        # an event, the store puts it into the parent's inbox with the settle.
        self.for_parent: Any = None

    @classmethod
    def enqueue(
        cls,
        *,
        run_id: UUID,
        agent: str,
        request_digest: str,
        actor: str,
        idempotency_key: str | None = None,
        trace_parent: str | None = None,
        queue: str = "default",
        priority: int = 0,
        parent: tuple[UUID, int, PrivacyLevel] | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
    ) -> Run:
        """A new queued run. Its request body is saved by the store, keyed by the run.
        `trace_parent` (a W3C traceparent) is the trace its segments join; `queue` and
        `priority` are where and in which order the claim takes it (checked by the caller,
        `domain.queues`); `parent` is a child run's (parent id, step seq, privacy level);
        `concurrency_key` and `concurrency_limit` how many runs of its key may run at once
        (`domain.concurrency`; both or neither)."""
        if (concurrency_key is None) != (concurrency_limit is None):
            raise ValueError("a concurrency key and its limit go together")
        event = cls.Queued(
            actor=actor,
            run_id=run_id,
            agent=agent,
            request_digest=request_digest,
            idempotency_key=idempotency_key,
            trace_parent=trace_parent,
            queue=queue,
            priority=priority,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
        )
        if parent is not None:
            event = event.model_copy(
                update={"parent_id": parent[0], "parent_seq": parent[1], "privacy": parent[2]}
            )
        return cls._created(event)

    @classmethod
    def start(
        cls,
        *,
        run_id: UUID,
        agent: str,
        request_digest: str,
        holder: str,
        lease_ms: int,
        trace_parent: str | None = None,
    ) -> Run:
        """A new interactive run, running at once in its caller's process under `holder`."""
        _check_lease(lease_ms)
        event = cls.Started(
            actor=holder,
            run_id=run_id,
            agent=agent,
            request_digest=request_digest,
            lease_ms=lease_ms,
            trace_parent=trace_parent,
        )
        return cls._created(event)

    @classmethod
    def _created(cls, event: RunEvent) -> Run:
        run = cls(event.apply(None))
        run._committed_version = 0
        run._pending.append(event)
        return run

    @classmethod
    def replay(cls, events: Iterable[RunEvent]) -> Run:
        """The run as its recorded events describe it."""
        state = fold(events)
        if state is None:
            raise IllegalTransition("a run needs at least its creation event")
        return cls(state)

    # -- reading -------------------------------------------------------------------------------

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def id(self) -> UUID:
        return self._state.run_id

    @property
    def status(self) -> RunStatus:
        return self._state.status

    @property
    def version(self) -> int:
        return self._state.version

    @property
    def committed_version(self) -> int:
        """The version the store last confirmed; the next append is fenced on it."""
        return self._committed_version

    @property
    def pending_events(self) -> tuple[RunEvent, ...]:
        return tuple(self._pending)

    @property
    def pending_journal(self) -> tuple[tuple[int, JournalEntry], ...]:
        """(step seq, journal entry) of the pending steps: the store writes them with the
        events. (The entry's own `seq` is that of whoever made it; the pair's is the step's.)"""
        return tuple(self._pending_journal)

    def checkpoint(self) -> Checkpoint:
        """Where the run stands now: its state and how many events and entries are pending."""
        return self._state, len(self._pending), len(self._pending_journal)

    def restore(self, checkpoint: Checkpoint) -> None:
        """Forget the events and entries triggered since `checkpoint` (not recorded)."""
        state, pending, journal = checkpoint
        self._state = state
        del self._pending[pending:]
        del self._pending_journal[journal:]

    def mark_committed(self) -> None:
        """The store recorded every pending event (and journal entry)."""
        self._pending.clear()
        self._pending_journal.clear()
        self._committed_version = self._state.version

    def mark_committed_first(self, count: int) -> None:
        """The store recorded the first `count` pending events (an earlier append whose
        reply was lost turned out to have landed); the rest stay pending."""
        if not 0 <= count <= len(self._pending):
            raise ValueError("count must be between 0 and the number of pending events")
        landed = {e.seq for e in self._pending[:count] if isinstance(e, Run.StepRecorded)}
        self._pending_journal = [(q, j) for q, j in self._pending_journal if q not in landed]
        del self._pending[:count]
        self._committed_version += count

    # -- commands ------------------------------------------------------------------------------

    def claim(self, *, holder: str, lease_ms: int) -> None:
        """Take a queued run under a lease of `lease_ms`, or a waiting one whose deadline the
        store's claim found passed (ADR 0068)."""
        if not (self._state.status.is_waiting and self._state.wake_after_ms is not None):
            self._guard({RunStatus.QUEUED}, "claim")
        _check_lease(lease_ms)
        self._trigger(self.Claimed(actor=holder, lease_ms=lease_ms))

    def record_step(
        self,
        *,
        kind: str,
        name: str,
        duration_ms: int,
        payload: Mapping[str, Any] | None = None,
        privacy: PrivacyLevel = PrivacyLevel.METADATA,
        error_type: str | None = None,
        tokens: int = 0,
        cost: float = 0.0,
        journal: JournalEntry | None = None,
    ) -> int:
        """Record the next step; returns its sequence number. The payload must already have
        been filtered for `privacy` (the domain's privacy policy does that). `journal` is the
        step's verbatim outcome, written beside the log in the same append as this step."""
        holder = self._holder("record a step")
        seq = self._state.steps + 1
        if journal is not None:
            self._pending_journal.append((seq, journal))
        self._trigger(
            self.StepRecorded(
                actor=holder,
                seq=seq,
                kind=kind,
                name=name,
                duration_ms=max(0, duration_ms),
                # The event validates the mapping into a dict of its own: no copy first.
                payload=payload or {},
                privacy=privacy,
                error_type=error_type,
                tokens=tokens,
                cost=cost,
            )
        )
        return seq

    def record_replay(self, *, count: int, last_seq: int) -> None:
        """Note in the trail that this segment replayed `count` journaled steps."""
        holder = self._holder("replay")
        if count < 1:
            raise IllegalTransition("a replay covers at least one step")
        self._trigger(self.Replayed(actor=holder, count=count, last_seq=last_seq))

    def renew_lease(self) -> None:
        """Extend the lease without recording a step (a long step's background heartbeat)."""
        self._trigger(self.LeaseRenewed(actor=self._holder("renew the lease")))

    def mark_effect_pending(self, *, tool: str, effect: Effect) -> int:
        """Record that write tool `tool` is about to run as the next step; returns that step's
        sequence number, which the tool's result must be recorded under."""
        holder = self._holder("run a write tool")
        if not effect.is_write:
            raise IllegalTransition("only a write tool needs a pending-effect marker")
        seq = self._state.steps + 1
        self._trigger(self.EffectPending(actor=holder, seq=seq, tool=tool, effect=effect))
        return seq

    def complete(
        self,
        *,
        result: Mapping[str, Any] | None = None,
        privacy: PrivacyLevel = PrivacyLevel.METADATA,
    ) -> None:
        holder = self._holder("complete")
        self._trigger(self.Completed(actor=holder, result=dict(result or {}), privacy=privacy))

    def fail(
        self,
        *,
        reason: TerminationReason,
        failure_class: FailureClass | None = None,
        error_type: str | None = None,
    ) -> None:
        holder = self._holder("fail")
        self._trigger(
            self.Failed(
                actor=holder, reason=reason, failure_class=failure_class, error_type=error_type
            )
        )

    def cancel(self, *, actor: str, note: str | None = None) -> None:
        """Cancel a queued, running or waiting run."""
        if self._state.status.is_terminal:
            raise IllegalTransition(f"cannot cancel a run that is {self._state.status}")
        self._trigger(self.Cancelled(actor=actor, note=note))

    def requeue(
        self, *, delay_ms: int, failure_class: FailureClass, error_type: str | None
    ) -> None:
        """The holder sends its failed run back to the queue (the retry ladder decided so)."""
        holder = self._holder("requeue")
        if self._state.segment is not Segment.WORKER or not self._state.has_saved_request:
            raise IllegalTransition("only a queued worker run with its request can be requeued")
        if delay_ms < 0:
            raise IllegalTransition("a requeue delay cannot be negative")
        self._trigger(
            self.Requeued(
                actor=holder,
                delay_ms=delay_ms,
                failure_class=failure_class,
                error_type=error_type,
            )
        )

    def reclaim(self, *, actor: str) -> None:
        """The reaper puts a running run whose lease expired back on the queue."""
        self._guard({RunStatus.RUNNING}, "reclaim")
        if not self._state.has_saved_request:
            raise IllegalTransition("a run without its saved request cannot be reclaimed")
        self._trigger(self.Reclaimed(actor=actor, previous_holder=self._state.holder))

    def dead_letter(
        self,
        *,
        actor: str,
        reason: TerminationReason,
        cause: str,
        failure_class: FailureClass | None = None,
        error_type: str | None = None,
    ) -> None:
        """End a running run for good, by its holder (failure) or by the reaper (stale)."""
        self._guard({RunStatus.RUNNING}, "dead-letter")
        if not reason.is_dead_letter:
            raise IllegalTransition(f"{reason} is not a dead-letter reason")
        self._trigger(
            self.DeadLettered(
                actor=actor,
                reason=reason,
                cause=cause,
                failure_class=failure_class,
                error_type=error_type,
            )
        )

    def retry(
        self,
        *,
        actor: str,
        reset_budget: bool = False,
        force: bool = False,
        mode: RetryMode = RetryMode.RESUME,
        position: int = 1,
        rerun_writes: tuple[str, ...] = (),
    ) -> None:
        """Put a failed run back on the queue. The caller has checked that its request is
        still saved and passes what `retry_plan.plan_retry` made of its journal: how it runs
        again, from which step `position`, and the recorded non-idempotent writes that
        repeats. Those, or a pending write (its outcome unknown), are refused unless
        `force`, which the event records."""
        if self._state.status is not RunStatus.FAILED:
            raise IllegalTransition(
                f"only a failed run can be retried; this one is {self._state.status}"
            )
        if not actor.strip():
            raise IllegalTransition("a retry needs the name of who retries (--by)")
        pending_write = self._state.pending_non_idempotent_write
        if pending_write and not force:
            tools = ", ".join(p.tool for p in self._state.pending_effects if p.effect.is_write)
            raise PendingWrite(
                f"a non-idempotent write ({tools}) may have happened before the run failed; "
                "retry with --force to run it again on your responsibility"
            )
        if rerun_writes and not force:
            tools = ", ".join(rerun_writes)
            if mode is RetryMode.RESTART:
                raise PendingWrite(
                    f"the run already did non-idempotent writes ({tools}) and its journal is "
                    "gone (it failed before failed runs kept theirs), so a retry runs it again "
                    "from its request, repeating them; retry with --force to take that "
                    "responsibility"
                )
            raise PendingWrite(
                f"retrying from step {position} runs again the non-idempotent writes "
                f"the run recorded there or later ({tools}); retry with --force to take "
                "that responsibility, or from a later step"
            )
        self._trigger(
            self.Retried(
                actor=actor,
                reset_budget=reset_budget,
                forced=pending_write or bool(rerun_writes),
                previous_reason=self._state.reason,
                cleared_tools=tuple(p.tool for p in self._state.pending_effects),
                rerun_tools=tuple(rerun_writes),
                mode=mode,
                position=position,
            )
        )

    def suspend(
        self,
        *,
        kind: WaitKind,
        digest: str,
        pending_tools: tuple[str, ...] = (),
        input_schema: dict[str, Any] | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """Stop to wait for a person; the store saves the resumable state beside the log.
        With `timeout_ms`, the decision expires that long after the suspension."""
        holder = self._holder("suspend")
        if kind not in (WaitKind.APPROVAL, WaitKind.INPUT):
            raise IllegalTransition(f"a {kind} wait is not a person's decision (see domain.waits)")
        if timeout_ms is not None and timeout_ms < 0:
            raise IllegalTransition("a wait's timeout cannot be negative")
        self._trigger(
            self.Suspended(
                actor=holder,
                kind=kind,
                digest=digest,
                pending_tools=pending_tools,
                input_schema=input_schema,
                timeout_ms=timeout_ms,
            )
        )

    def decide(
        self,
        *,
        by: str,
        kind: WaitKind,
        approved: bool,
        digest: str,
        input_keys: tuple[str, ...] = (),
    ) -> None:
        """Record a person's decision on what the run waits for. The caller has checked the
        digest against the resumable state; the domain checks it against the Suspended event."""
        waiting = self._state.waiting
        if waiting is None or not self._state.status.is_decidable:
            raise IllegalTransition(f"cannot decide a run that is {self._state.status}")
        if waiting.kind is not kind:
            raise IllegalTransition(f"the run waits for {waiting.kind}, not {kind}")
        if self._state.decision is not None:
            raise IllegalTransition("the run was already decided and is resuming")
        if digest != waiting.digest:
            raise DigestMismatch("the decision names pending calls other than the run's")
        self._trigger(
            self.Decided(
                actor=by, kind=kind, approved=approved, digest=digest, input_keys=input_keys
            )
        )

    def resume(self, *, holder: str, lease_ms: int) -> None:
        """Take a decided, waiting run under a `resume:` lease in the caller's process."""
        self._require_decided("resume")
        _check_lease(lease_ms)
        self._trigger(self.Resumed(actor=holder, lease_ms=lease_ms))

    def release(self, *, actor: str) -> None:
        """Hand a decided, waiting run to the queue so that a worker resumes it."""
        self._require_decided("release")
        if not self._state.has_saved_request:
            raise IllegalTransition("a run without a saved request cannot go back on the queue")
        self._trigger(self.Released(actor=actor))

    # -- internals -----------------------------------------------------------------------------

    def _require_decided(self, verb: str) -> None:
        if not self._state.status.is_waiting:
            raise IllegalTransition(f"cannot {verb} a run that is {self._state.status}")
        if self._state.decision is None:
            raise IllegalTransition(f"cannot {verb} a run nobody has decided yet")

    def _guard(self, allowed: set[RunStatus], verb: str) -> None:
        if self._state.status not in allowed:
            raise IllegalTransition(f"cannot {verb} a run that is {self._state.status}")

    def _holder(self, verb: str) -> str:
        self._guard({RunStatus.RUNNING}, verb)
        assert self._state.holder is not None, "a running run always has a holder"
        return self._state.holder

    def trigger(self, event: RunEvent) -> None:
        """Apply and keep `event`: for the commands of sibling domain modules (waits), which
        check their own guards first as the commands here do."""
        self._trigger(event)

    def guard(self, allowed: set[RunStatus], verb: str) -> None:
        """IllegalTransition unless the run's status is in `allowed`."""
        self._guard(allowed, verb)

    def holder(self, verb: str) -> str:
        """The running run's holder (IllegalTransition if it is not running)."""
        return self._holder(verb)

    def _trigger(self, event: RunEvent) -> None:
        self._state = apply(self._state, event)
        self._pending.append(event)


Checkpoint = tuple[RunState, int, int]


def _check_lease(lease_ms: int) -> None:
    if lease_ms <= 0:
        raise IllegalTransition("a lease must be positive")


# The waits' and the priority's events are run events too: importing their modules registers
# their topics wherever the run's events are decoded (ADR 0073, 0077).
from steptrail.domain import queues as _queues  # noqa: E402, F401
from steptrail.domain import waits as _waits  # noqa: E402, F401
