"""The operator's retry of a failed run: resume from its journal, or run again from step N.

A failed (or dead-lettered) run keeps its saved request and its step journal until it is
purged or retried (ADRs 0025, 0068 §4, 0070). A retry is one fenced append of `Run.Retried`
that puts the run back on the queue; the worker that claims it reads the journal as every
segment does, replays the recorded steps and runs on from the first one the journal cannot
answer. What the retry may do is decided before anything is written, from three reads:

* the run (it must be failed, and its request still saved),
* its log (which non-idempotent writes were done, `retry_plan.writes_done_at`),
* its journal (what replays, `retry_plan.plan_retry`).

None of them is locked: the append is fenced on the version the run was read at, and every
change to the journal comes with an append (a step, a settle, another retry), so a journal
that changed since it was read makes the append conflict. `retry --from N` deletes the
entries at positions N and later in that same transaction (`store_base.journal_cut`), after
the fence: a retry that loses the race deletes nothing.

Two operators retrying at once both read the run failed; the second append conflicts and
is refused with `AlreadyRetried`, nothing written (the run is queued once, its journal cut
at most once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from steptrail.domain.actors import check_actor
from steptrail.domain.enums import RunStatus, TerminationReason
from steptrail.domain.errors import IllegalTransition, UnknownRun, VersionConflict
from steptrail.domain.ports import RunStore
from steptrail.domain.retry_plan import RetryPlan, plan_retry, writes_done_at
from steptrail.domain.run import Run

# A failed run changes only by a retry or a purge, so a conflict is one of those: a second
# look settles it. More than one conflict in a row means something else writes failed runs.
ATTEMPTS = 3


class RetryStore(RunStore, Protocol):
    """A run store that also lists failed runs (both backends' stores are)."""

    def failed_ids(
        self, *, agent: str | None, reason: str | None, since: datetime, limit: int
    ) -> list[UUID]: ...


class AlreadyRetried(IllegalTransition):
    """Somebody else retried this run first (or it changed meanwhile); nothing was written."""


@dataclass
class RetryReport:
    """What a bulk retry did: the runs put back on the queue, and those refused (with why)."""

    retried: list[UUID] = field(default_factory=list)
    refused: list[tuple[UUID, str]] = field(default_factory=list)


class Retries:
    """The retry use cases over one store (`Runtime.retry`, the CLI and the console)."""

    def __init__(self, store: RetryStore, log: Any, unknown: Callable[[UUID], UnknownRun]) -> None:
        self.store = store
        self.log = log
        self._unknown = unknown

    def plan(self, run_id: UUID, *, from_position: int | None = None) -> tuple[Run, RetryPlan]:
        """The run as read now and what retrying it would do (nothing is written): which
        step it runs again from and which recorded non-idempotent writes that repeats.

        Raises:
            UnknownRun: no such run.
            InvalidRetryPosition: `from_position` is out of the journal's range.
        """
        run = self.store.load(run_id)
        if run is None:
            raise self._unknown(run_id)
        if run.status is not RunStatus.FAILED:
            return run, RetryPlan()
        done = writes_done_at(e.event for e in self.store.history(run_id))
        plan = plan_retry(
            self.store.journal(run_id),
            done,
            steps=run.state.steps,
            from_position=from_position,
        )
        return run, plan

    def retry(
        self,
        run_id: UUID,
        *,
        by: str,
        reset_budget: bool = False,
        force: bool = False,
        from_position: int | None = None,
    ) -> Run:
        """Put a failed run back on the queue, resuming (or from step `from_position`).

        Raises:
            UnknownRun: no such run.
            PendingWrite: a non-idempotent write's outcome is unknown, or a recorded one
                would run again (pass `force`).
            InvalidRetryPosition: `from_position` is out of the journal's range.
            AlreadyRetried: somebody retried it first.
            IllegalTransition: the run is not failed, or has no saved request.
            InvalidActor: `by` is not an acceptable actor name.
        """
        check_actor(by)
        for _ in range(ATTEMPTS):
            run, plan = self.plan(run_id, from_position=from_position)
            if run.status is RunStatus.FAILED and self.store.saved(run_id, "request") is None:
                raise IllegalTransition(
                    f"run {run_id} has no saved request to run again (it was started "
                    "interactively, or it failed before failed runs kept their request); "
                    "enqueue a new run instead"
                )
            run.retry(
                actor=by,
                reset_budget=reset_budget,
                force=force,
                mode=plan.mode,
                position=plan.position,
                rerun_writes=plan.rerun_writes,
            )
            try:
                self.store.append(run)
            except VersionConflict:
                now = self.store.load(run_id)
                if now is None:
                    raise self._unknown(run_id) from None
                if now.status is not RunStatus.FAILED:
                    raise AlreadyRetried(
                        f"run {run_id} was retried by {self._retried_by(run_id, run)} first "
                        f"(it is {now.status} now); this retry wrote nothing"
                    ) from None
                continue
            self.log.info(
                "run_retried",
                run_id=str(run_id),
                by=by,
                version=run.version,
                mode=plan.mode.value,
                position=plan.position,
                reset_budget=reset_budget,
                forced=force,
            )
            return run
        raise IllegalTransition(f"run {run_id} kept changing; retry did not land")

    def _retried_by(self, run_id: UUID, mine: Run) -> str:
        """Who appended the retry that beat `mine` (the event right after the version it
        was read at), or "somebody else" if that was not a retry."""
        first = mine.committed_version + 1
        won = self.store.history(run_id, first=first, limit=1)
        if won and isinstance(won[0].event, Run.Retried):
            return won[0].event.actor
        return "somebody else"

    def retry_many(
        self,
        *,
        by: str,
        since: datetime,
        agent: str | None = None,
        reason: TerminationReason | str | None = None,
        reset_budget: bool = False,
        force: bool = False,
        limit: int = 1000,
    ) -> RetryReport:
        """Retry (resuming) every failed run of `agent` ended for `reason` since `since` (at
        most `limit`, oldest first). A run that cannot be retried is reported, not raised."""
        if limit < 1:
            raise ValueError("limit must be a positive integer")
        check_actor(by)
        ids = self.store.failed_ids(
            agent=agent,
            reason=TerminationReason(reason).value if reason else None,
            since=since,
            limit=limit,
        )
        report = RetryReport()
        for run_id in ids:
            try:
                self.retry(run_id, by=by, reset_budget=reset_budget, force=force)
            except (IllegalTransition, UnknownRun) as error:
                report.refused.append((run_id, str(error)))
            else:
                report.retried.append(run_id)
        return report
