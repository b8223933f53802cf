"""Waiting for a person, as steps of the agent (ADR 0015, 0073): `RunContext.request_approval`
and `request_input` delegate here. Split out of `workers/context.py` when child runs took it
past the house limit again (ADR 0081).

The decision is replayed from the journal, taken now (a resumed segment records it as a
`decision` step), taken as expired (the claim woke the run at the wait's deadline), or
waited for: the resumable state is saved verbatim and the run suspends (no lease, no slot).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Never

from steptrail.domain.decisions import ResumableState
from steptrail.domain.digest import canonical_json
from steptrail.domain.enums import Outcome, WaitKind
from steptrail.domain.journal import NonDeterministic, StepCall, fingerprint
from steptrail.domain.limits import check_depth, check_size
from steptrail.domain.privacy import filter_schema
from steptrail.domain.run import DECISION_STEP, Run
from steptrail.workers import waits
from steptrail.workers.context_parts import Resumption, Suspend, _resumption_of, jsonable
from steptrail.workers.segment import LeaseLost

if TYPE_CHECKING:
    from steptrail.workers.context import RunContext


def await_decision(
    ctx: RunContext,
    state: ResumableState,
    digest: str,
    tools: tuple[str, ...],
    timeout: float | None = None,
) -> Resumption:
    """The decision on `state`: replayed, taken now (resumed segment), or waited for."""
    call = StepCall(DECISION_STEP, state.kind.value, fingerprint(digest))
    entry = ctx._next(call)
    if entry is not None:
        ctx._taken = _resumption_of(entry.value)
        return ctx._taken
    decision = ctx.decision
    if decision is not None and not ctx._by_hand:
        resumption = ctx._resumption()
        if decision.kind is not state.kind or decision.digest != digest or not resumption:
            found = StepCall(DECISION_STEP, decision.kind.value, fingerprint(decision.digest))
            ctx._journal.diverged = NonDeterministic(ctx._journal.position, found, call)
            raise ctx._journal.diverged
        take(ctx, call, resumption)
        return resumption
    woke = ctx._segment.run.state.woke
    if woke is not None and woke.kind is state.kind and woke.digest == digest:
        # Claimed at the wait's deadline with nobody's decision: it expired (ADR 0073).
        expired = Resumption(
            kind=state.kind,
            approved=False,
            by=waits.EXPIRED_BY,
            calls=state.calls,
            conversation=state.conversation,
            values=None,
            expired=True,
        )
        take(ctx, call, expired)
        return expired
    return suspend(ctx, state, digest, tools, waits.timeout_ms(timeout))


def take(ctx: RunContext, call: StepCall, resumption: Resumption) -> None:
    """Record the agent taking its decision as a step (its outcome journaled)."""
    ctx._taken = resumption
    value = {
        "kind": resumption.kind.value,
        "approved": resumption.approved,
        "by": resumption.by,
        "calls": [c.model_dump(mode="json") for c in resumption.calls],
        "conversation": resumption.conversation,
        "values": resumption.values,
        "expired": resumption.expired,
    }
    # The log gets who decided and how, never the calls' or the input's content (ADR
    # 0008); the journal keeps it verbatim, like the resumable state it came from.
    payload: dict[str, Any] = {"approved": resumption.approved, "by": resumption.by}
    if resumption.expired:
        payload["expired"] = True
    waits.record_outcome(ctx, call, payload, value)


def suspend(
    ctx: RunContext,
    state: ResumableState,
    digest: str,
    tools: tuple[str, ...],
    deadline_ms: int | None = None,
) -> Never:
    check_depth(state.conversation, "the saved conversation")
    body = canonical_json(jsonable(state.model_dump(mode="json")))
    check_size(len(body), ctx._max_payload_bytes, "the saved resumable state")
    kind = state.kind
    ctx.note_replay()

    logged_schema = filter_schema(state.input_schema, ctx._privacy)

    def suspend(run: Run) -> None:
        run.suspend(
            kind=kind,
            digest=digest,
            pending_tools=tools,
            input_schema=logged_schema,
            timeout_ms=deadline_ms,
        )

    try:
        ctx._segment.commit(suspend, resumable=body)
    except LeaseLost as lost:
        # A cancel (or a takeover) won the race: the run was not suspended. First outcome
        # wins, so it stays as the canceller left it; this segment reports suspend_failed.
        if lost.outcome is Outcome.CANCELLED:
            raise LeaseLost(Outcome.SUSPEND_FAILED, lost.why) from lost
        raise
    ctx.log.info("run_suspended", waiting_for=kind.value, version=ctx._segment.run.version)
    raise Suspend(
        Outcome.AWAITING_APPROVAL if kind is WaitKind.APPROVAL else Outcome.AWAITING_INPUT
    )
