"""Child runs: the signal a settling child sends its parent (ADR 0075).

A child run is an ordinary run whose `Queued` event names its parent (`parent_id`, and the
parent's step `parent_seq`). Its settling append (completed, failed for good, cancelled) also
stores the signal `steptrail.child:<child id>` in the parent's inbox, in the same
transaction, and wakes the parent if it waits for it. The signal's payload is what the
parent needs: the child's status and verbatim result, or its failure class and reason. The
`Completed` event's result is privacy-filtered; the signal is not in the log, so the parent
gets the result whatever the child's level (the inbox is purged with the parent's run).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from steptrail.domain.enums import RunStatus
from steptrail.domain.run import Run

# Signal names steptrail sends itself; nobody else may send or wait for one.
RESERVED_PREFIX = "steptrail."
CHILD_PREFIX = "steptrail.child:"
# The step kinds a child run's start and a wait for children are journaled as.
CHILD_STEP = "child"
CHILD_WAIT_STEP = "child_wait"
# Who a cascading cancel is recorded as.
PARENT_ACTOR = "parent:"


def child_signal(child_id: UUID) -> str:
    """The name of the signal child `child_id` sends its parent when it settles."""
    return f"{CHILD_PREFIX}{child_id}"


def refuse_reserved(name: str) -> None:
    """ValueError for a signal name in steptrail's reserved namespace (`steptrail.`)."""
    if name.startswith(RESERVED_PREFIX):
        raise ValueError(
            f"signal names starting with {RESERVED_PREFIX!r} are reserved for steptrail "
            f"(child runs): {name[:80]!r}"
        )


def settles_child(run: Run) -> bool:
    """Whether `run`'s pending events settle a child run (its parent must learn it)."""
    return (
        run.state.parent_id is not None
        and run.state.status.is_terminal
        and any(isinstance(e, _SETTLING) for e in run.pending_events)
    )


_SETTLING = (Run.Completed, Run.Failed, Run.DeadLettered, Run.Cancelled)


def settlement(run: Run) -> dict[str, Any]:
    """The payload of the signal a settling child sends: status, and result or failure."""
    state = run.state
    body: dict[str, Any] = {"child": str(state.run_id), "status": state.status.value}
    if state.status is RunStatus.COMPLETED:
        body["result"] = run.for_parent
    else:
        body["failure_class"] = state.failure_class.value if state.failure_class else None
        body["reason"] = state.reason.value if state.reason else None
        body["error_type"] = state.error_type
    return body


class ChildFailed(Exception):
    """A child run the parent waited for did not complete: it failed (for good) or was
    cancelled. `failure_class` is the child's (None when cancelled), `reason` its
    termination reason, `status` its final status."""

    def __init__(
        self,
        child_id: str,
        *,
        status: str,
        failure_class: str | None,
        reason: str | None,
        error_type: str | None,
    ) -> None:
        what = f"{failure_class}" if failure_class else (reason or status)
        detail = f" ({error_type})" if error_type else ""
        super().__init__(f"child run {child_id} ended {status}: {what}{detail}")
        self.child_id = child_id
        self.status = status
        self.failure_class = failure_class
        self.reason = reason
        self.error_type = error_type

    @classmethod
    def of(cls, body: dict[str, Any]) -> ChildFailed:
        return cls(
            str(body.get("child")),
            status=str(body.get("status")),
            failure_class=body.get("failure_class"),
            reason=body.get("reason"),
            error_type=body.get("error_type"),
        )
