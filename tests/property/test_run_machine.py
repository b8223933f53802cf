"""Stateful property test of the `Run` aggregate against a small, independent lifecycle model.

Hypothesis drives runs with random commands, legal and illegal alike. The model below says
which commands are legal and what they must do; it is written from the reference behaviour
(BRIEF §1), not from `domain/run.py`, so the two check each other. An illegal command must
raise and change nothing. After every step the invariants are checked: contiguous versions,
nothing after a terminal status (but an operator's retry of a failed run), one lease holder
and only while running, replay equals the live state, and a requeue count no larger than
what the commands did.

Each command has a directed rule, enabled only in the statuses where it can be legal (its
arguments may still make it illegal), and `anything` tries any command at any time. Without
the direction most steps would be refusals and the deep paths (suspend, decide, resume,
release, requeue after resume…) would hardly be reached within the step budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from steptrail.domain.digest import digest
from steptrail.domain.enums import (
    Effect,
    FailureClass,
    RunStatus,
    Segment,
    TerminationReason,
    WaitKind,
)
from steptrail.domain.errors import DigestMismatch, IllegalTransition
from steptrail.domain.run import Run, RunEvent
from steptrail.projections.run_index import COLUMN_FIELDS, document_only

WORKERS = ("worker:host-a:1:aaaa", "worker:host-b:2:bbbb")
RESUMERS = ("resume:host-a:3:cccc", "resume:host-c:4:dddd")
DIGESTS = (digest(["send_email"]), digest(["delete_file"]))
WAITING = {
    WaitKind.APPROVAL: RunStatus.WAITING_FOR_APPROVAL,
    WaitKind.INPUT: RunStatus.WAITING_FOR_INPUT,
}
TERMINAL = {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
DEAD_LETTER = {TerminationReason.NOT_RETRYABLE, TerminationReason.RETRIES_EXHAUSTED}

# The arguments of each command, drawn from small pools that hold legal and illegal values.
ARGS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "claim": st.fixed_dictionaries(
        {"holder": st.sampled_from(WORKERS), "lease_ms": st.sampled_from([-1, 0, 1, 900_000])}
    ),
    "record_step": st.fixed_dictionaries(
        {"kind": st.sampled_from(["llm", "tool"]), "errored": st.booleans()}
    ),
    "renew_lease": st.fixed_dictionaries({}),
    "mark_effect_pending": st.fixed_dictionaries({"effect": st.sampled_from(list(Effect))}),
    "settle": st.fixed_dictionaries(
        {
            "how": st.sampled_from(["complete", "fail", "cancel", "dead_letter"]),
            "reason": st.sampled_from(list(TerminationReason)),
        }
    ),
    "requeue": st.fixed_dictionaries({"delay_ms": st.sampled_from([-1, 0, 30_000])}),
    "reclaim": st.fixed_dictionaries({}),
    "suspend": st.fixed_dictionaries(
        {"kind": st.sampled_from(list(WaitKind)), "calls": st.sampled_from(DIGESTS)}
    ),
    "decide": st.fixed_dictionaries(
        {
            "exact": st.booleans(),
            "kind": st.sampled_from(list(WaitKind)),
            "calls": st.sampled_from(DIGESTS),
            "approved": st.booleans(),
        }
    ),
    "resume": st.fixed_dictionaries(
        {"holder": st.sampled_from(RESUMERS), "lease_ms": st.sampled_from([-1, 0, 1, 900_000])}
    ),
    "release": st.fixed_dictionaries({}),
    "retry": st.fixed_dictionaries({"reset_budget": st.booleans(), "force": st.booleans()}),
}


@dataclass
class Model:
    """What the reference lifecycle says a run's observable state is."""

    status: RunStatus
    holder: str | None
    segment: Segment | None
    saved_request: bool
    version: int = 1
    requeue_count: int = 0
    steps: int = 0
    # (step, effect, segment that recorded it): only that segment's result clears a marker.
    pending: list[tuple[int, Effect, int]] = field(default_factory=list)
    segment_no: int = 0
    waiting: WaitKind | None = None
    waiting_digest: str | None = None
    decided: bool = False
    resumable: bool = False

    @property
    def running(self) -> bool:
        return self.status is RunStatus.RUNNING

    @property
    def live(self) -> bool:
        return self.status not in TERMINAL

    @property
    def is_waiting(self) -> bool:
        return self.waiting is not None and self.status is WAITING[self.waiting]

    def release(self, status: RunStatus) -> None:
        self.status, self.holder, self.segment = status, None, None

    def settle(self, status: RunStatus) -> None:
        """Terminal: no lease, no saved request, no resumable state; effect markers stay."""
        self.release(status)
        self.saved_request = False
        self.resumable = False
        self.waiting = None


class RunMachine(RuleBasedStateMachine):
    """Random commands on a run, checked against `Model` after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.run: Run
        self.model: Model
        self.events: list[RunEvent] = []
        self.requeues_done = 0
        self.settled_at: int | None = None
        self.runs = 0

    # -- plumbing ------------------------------------------------------------------------------

    def attempt(
        self,
        legal: bool,
        command: Callable[[Run], Any],
        event: type[RunEvent],
        update: Callable[[Any], None] = lambda _: None,
        error: type[Exception] = IllegalTransition,
    ) -> None:
        """Run `command`: if legal it records exactly `event`, else it raises `error` and
        changes nothing at all."""
        run = self.run
        before = (run.state, run.version, run.committed_version, run.pending_events)
        if not legal:
            with pytest.raises(error):
                command(run)
            assert (run.state, run.version, run.committed_version, run.pending_events) == before
            return
        already = len(run.pending_events)
        result = command(run)
        new = list(run.pending_events[already:])
        assert [type(e) for e in new] == [event]
        if document_only(new):
            # The SQLite append rewrites only version, document and lease for these (ADR
            # 0039): every other column of the index must be what it was.
            columns = [f for f in COLUMN_FIELDS if f != "version"]
            assert [getattr(run.state, f) for f in columns] == [
                getattr(before[0], f) for f in columns
            ]
            assert run.state.status is RunStatus.RUNNING
        self.events.extend(new)
        self.model.version += 1
        update(result)
        if not self.model.live and self.settled_at is None:
            self.settled_at = len(self.events)

    def new_run(self, interactive: bool, holder: str) -> None:
        self.runs += 1
        run_id = UUID(int=self.runs)
        if interactive:
            holder = "interactive:" + holder
            self.run = Run.start(
                run_id=run_id,
                agent="echo",
                request_digest=DIGESTS[0],
                holder=holder,
                lease_ms=900_000,
            )
            self.model = Model(
                status=RunStatus.RUNNING,
                holder=holder,
                segment=Segment.INTERACTIVE,
                saved_request=False,
                segment_no=1,
            )
        else:
            self.run = Run.enqueue(
                run_id=run_id, agent="echo", request_digest=DIGESTS[0], actor="api"
            )
            self.model = Model(
                status=RunStatus.QUEUED, holder=None, segment=None, saved_request=True
            )
        self.events = list(self.run.pending_events)
        self.requeues_done = 0
        self.settled_at = None

    # -- the commands, each judged by the model ------------------------------------------------

    def do_claim(self, holder: str, lease_ms: int) -> None:
        m = self.model

        def update(_: Any) -> None:
            m.status, m.holder, m.segment = RunStatus.RUNNING, holder, Segment.WORKER
            m.segment_no += 1

        self.attempt(
            m.status is RunStatus.QUEUED and lease_ms > 0,
            lambda r: r.claim(holder=holder, lease_ms=lease_ms),
            Run.Claimed,
            update,
        )

    def do_record_step(self, kind: str, errored: bool) -> None:
        m = self.model

        def update(seq: Any) -> None:
            m.steps += 1
            assert seq == m.steps
            # Only the write's own successful result clears its marker.
            if not errored:
                m.pending = [p for p in m.pending if (p[0], p[2]) != (seq, m.segment_no)]

        self.attempt(
            m.running,
            lambda r: r.record_step(
                kind=kind,
                name="step",
                duration_ms=1,
                error_type="TimeoutError" if errored else None,
            ),
            Run.StepRecorded,
            update,
        )

    def do_renew_lease(self) -> None:
        self.attempt(self.model.running, lambda r: r.renew_lease(), Run.LeaseRenewed)

    def do_mark_effect_pending(self, effect: Effect) -> None:
        m = self.model

        def update(seq: Any) -> None:
            assert seq == m.steps + 1
            m.pending.append((seq, effect, m.segment_no))

        self.attempt(
            m.running and effect is not Effect.READ_ONLY,
            lambda r: r.mark_effect_pending(tool="tool", effect=effect),
            Run.EffectPending,
            update,
        )

    def do_settle(self, how: str, reason: TerminationReason) -> None:
        m = self.model
        if how == "complete":
            self.attempt(
                m.running,
                lambda r: r.complete(),
                Run.Completed,
                lambda _: m.settle(RunStatus.COMPLETED),
            )
        elif how == "fail":
            self.attempt(
                m.running,
                lambda r: r.fail(reason=reason),
                Run.Failed,
                lambda _: m.settle(RunStatus.FAILED),
            )
        elif how == "cancel":
            # Queued, running and waiting runs can all be cancelled; settled ones cannot.
            self.attempt(
                m.live,
                lambda r: r.cancel(actor="operator"),
                Run.Cancelled,
                lambda _: m.settle(RunStatus.CANCELLED),
            )
        else:
            self.attempt(
                m.running and reason in DEAD_LETTER,
                lambda r: r.dead_letter(actor="reaper", reason=reason, cause="test"),
                Run.DeadLettered,
                lambda _: m.settle(RunStatus.FAILED),
            )

    def _requeued(self, _: Any) -> None:
        self.model.release(RunStatus.QUEUED)
        self.model.requeue_count += 1
        self.requeues_done += 1

    def do_requeue(self, delay_ms: int) -> None:
        m = self.model
        self.attempt(
            m.running and m.segment is Segment.WORKER and m.saved_request and delay_ms >= 0,
            lambda r: r.requeue(
                delay_ms=delay_ms, failure_class=FailureClass.CONNECTION, error_type=None
            ),
            Run.Requeued,
            self._requeued,
        )

    def do_reclaim(self) -> None:
        m = self.model
        self.attempt(
            m.running and m.saved_request,
            lambda r: r.reclaim(actor="reaper"),
            Run.Reclaimed,
            self._requeued,
        )

    def do_suspend(self, kind: WaitKind, calls: str) -> None:
        m = self.model

        def update(_: Any) -> None:
            m.release(WAITING[kind])
            m.waiting, m.waiting_digest, m.decided, m.resumable = kind, calls, False, True

        # Only a person's waits are suspensions; timers and signals are WaitStarted (ADR 0073).
        legal = m.running and kind in WAITING
        self.attempt(legal, lambda r: r.suspend(kind=kind, digest=calls), Run.Suspended, update)

    def do_decide(self, exact: bool, kind: WaitKind, calls: str, approved: bool) -> None:
        m = self.model
        if exact and m.waiting is not None and m.waiting_digest is not None:
            kind, calls = m.waiting, m.waiting_digest
        allowed = m.is_waiting and m.waiting is kind and not m.decided
        mismatch = allowed and calls != m.waiting_digest

        def update(_: Any) -> None:
            m.decided = True

        self.attempt(
            allowed and not mismatch,
            lambda r: r.decide(by="operator", kind=kind, approved=approved, digest=calls),
            Run.Decided,
            update,
            DigestMismatch if mismatch else IllegalTransition,
        )

    def do_resume(self, holder: str, lease_ms: int) -> None:
        m = self.model

        def update(_: Any) -> None:
            m.status, m.holder, m.segment = RunStatus.RUNNING, holder, Segment.RESUME
            m.waiting = None
            m.segment_no += 1

        self.attempt(
            m.is_waiting and m.decided and lease_ms > 0,
            lambda r: r.resume(holder=holder, lease_ms=lease_ms),
            Run.Resumed,
            update,
        )

    def do_release(self) -> None:
        m = self.model

        def update(_: Any) -> None:
            m.status, m.waiting = RunStatus.QUEUED, None

        self.attempt(
            m.is_waiting and m.decided and m.saved_request,
            lambda r: r.release(actor="api"),
            Run.Released,
            update,
        )

    def do_retry(self, reset_budget: bool, force: bool) -> None:
        """An operator's retry: the one command legal after a terminal status (ADR 0025)."""
        m = self.model
        write = any(e is Effect.NON_IDEMPOTENT_WRITE for _, e, _ in m.pending)

        def update(_: Any) -> None:
            m.release(RunStatus.QUEUED)
            m.saved_request, m.resumable, m.waiting, m.decided = True, False, None, False
            m.pending = []
            if reset_budget:
                m.requeue_count = 0
            self.settled_at = None

        self.attempt(
            m.status is RunStatus.FAILED and (force or not write),
            lambda r: r.retry(actor="operator", reset_budget=reset_budget, force=force),
            Run.Retried,
            update,
        )

    # -- rules ---------------------------------------------------------------------------------

    @initialize(interactive=st.booleans(), holder=st.sampled_from(WORKERS))
    def create(self, interactive: bool, holder: str) -> None:
        self.new_run(interactive, holder)

    @precondition(lambda self: not self.model.live)
    @rule(interactive=st.booleans(), holder=st.sampled_from(WORKERS))
    def restart(self, interactive: bool, holder: str) -> None:
        """A settled run stays settled; the rest of the example goes on with a fresh run."""
        self.new_run(interactive, holder)

    @precondition(lambda self: not self.model.live)
    @rule(args=ARGS["settle"])
    def settle_again(self, args: dict[str, Any]) -> None:
        """A late or duplicate settle is refused: the first outcome wins."""
        self.do_settle(**args)

    @rule(data=st.data(), command=st.sampled_from(sorted(ARGS)))
    def anything(self, data: st.DataObject, command: str) -> None:
        """Any command at any time, in whatever status the run is."""
        getattr(self, "do_" + command)(**data.draw(ARGS[command]))

    @precondition(lambda self: self.model.status is RunStatus.QUEUED)
    @rule(args=ARGS["claim"])
    def claim(self, args: dict[str, Any]) -> None:
        self.do_claim(**args)

    @precondition(lambda self: self.model.running)
    @rule(args=ARGS["record_step"])
    def record_step(self, args: dict[str, Any]) -> None:
        self.do_record_step(**args)

    @precondition(lambda self: self.model.running)
    @rule()
    def renew_lease(self) -> None:
        self.do_renew_lease()

    @precondition(lambda self: self.model.running)
    @rule(args=ARGS["mark_effect_pending"])
    def mark_effect_pending(self, args: dict[str, Any]) -> None:
        self.do_mark_effect_pending(**args)

    @precondition(lambda self: self.model.live)
    @rule(args=ARGS["settle"])
    def settle(self, args: dict[str, Any]) -> None:
        """One rule for the four ways to end a run, so that runs live long enough to matter."""
        self.do_settle(**args)

    @precondition(lambda self: self.model.running)
    @rule(args=ARGS["requeue"])
    def requeue(self, args: dict[str, Any]) -> None:
        self.do_requeue(**args)

    @precondition(lambda self: self.model.running)
    @rule()
    def reclaim(self) -> None:
        self.do_reclaim()

    @precondition(lambda self: self.model.running)
    @rule(args=ARGS["suspend"])
    def suspend(self, args: dict[str, Any]) -> None:
        self.do_suspend(**args)

    @precondition(lambda self: self.model.is_waiting and not self.model.decided)
    @rule(args=ARGS["decide"])
    def decide(self, args: dict[str, Any]) -> None:
        self.do_decide(**args)

    @precondition(lambda self: self.model.is_waiting and self.model.decided)
    @rule(args=ARGS["resume"])
    def resume(self, args: dict[str, Any]) -> None:
        self.do_resume(**args)

    @precondition(lambda self: self.model.is_waiting and self.model.decided)
    @rule()
    def release(self) -> None:
        self.do_release()

    @precondition(lambda self: self.model.status is RunStatus.FAILED)
    @rule(args=ARGS["retry"])
    def retry(self, args: dict[str, Any]) -> None:
        self.do_retry(**args)

    @rule()
    def commit(self) -> None:
        """The store recorded what was pending; the next append is fenced on this version."""
        self.run.mark_committed()
        assert self.run.pending_events == ()
        assert self.run.committed_version == self.run.version

    @rule()
    def reload(self) -> None:
        """A fresh process loads the run from its whole log."""
        self.run = Run.replay(self.events)

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def versions_contiguous(self) -> None:
        assert self.run.version == len(self.events) == self.model.version
        assert self.run.committed_version + len(self.run.pending_events) == self.run.version
        assert list(self.run.pending_events) == self.events[self.run.committed_version :]

    @invariant()
    def nothing_after_terminal(self) -> None:
        if self.settled_at is not None:
            assert len(self.events) == self.settled_at
            assert self.run.status.is_terminal

    @invariant()
    def one_holder_only_while_running(self) -> None:
        s = self.run.state
        running = s.status is RunStatus.RUNNING
        assert (s.holder is not None) == running
        assert (s.segment is not None) == running
        assert (s.lease_ms is not None) == running
        assert (s.claim_version is not None) == running

    @invariant()
    def replay_equals_state(self) -> None:
        assert Run.replay(self.events).state == self.run.state

    @invariant()
    def requeues_bounded(self) -> None:
        assert self.run.state.requeue_count == self.model.requeue_count <= self.requeues_done

    @invariant()
    def matches_model(self) -> None:
        s, m = self.run.state, self.model
        assert s.status is m.status
        assert s.holder == m.holder
        assert s.segment is m.segment
        assert s.steps == m.steps
        assert [(p.seq, p.effect) for p in s.pending_effects] == [(q, e) for q, e, _ in m.pending]
        assert s.has_saved_request is m.saved_request
        assert s.has_resumable_state is m.resumable
        assert (s.waiting is not None) == m.is_waiting
        if s.status.is_terminal:
            assert not s.has_saved_request
            assert not s.has_resumable_state


def test_run_machine__random_commands_keep_every_invariant() -> None:
    """Random legal and illegal command sequences keep the run equal to the lifecycle model."""
    run_state_machine_as_test(
        RunMachine,
        settings=settings(max_examples=100, stateful_step_count=40, deadline=None),
    )
