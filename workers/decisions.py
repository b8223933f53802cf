"""Use cases of a person deciding on a waiting run: approve, deny, submit input, cancel.

A decision is checked completely before anything changes: the run must be waiting for that
kind of decision, its resumable state must parse and match the digest the run suspended with,
the quoted digest must match it, and input must satisfy the declared schema. Then one fenced
append records the decision *and* hands the run on, atomically:

* `Decided` + `Resumed` (lease `resume:…`): this process resumes the run now;
* `Decided` + `Released`: the run goes back on the queue and a worker resumes it.

Two people deciding at once both fence on the version they read; the second append
conflicts and is refused as "already resuming".
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, cast
from uuid import UUID

from pydantic import ValidationError

from steptrail.domain.actors import check_actor
from steptrail.domain.decisions import (
    PendingCall,
    ResumableState,
    check_input_bounds,
    state_digest,
)
from steptrail.domain.digest import canonical_json
from steptrail.domain.enums import Outcome, RunStatus, WaitKind
from steptrail.domain.errors import (
    CorruptResumableState,
    DigestMismatch,
    IllegalTransition,
    UnknownRun,
    VersionConflict,
)
from steptrail.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES
from steptrail.domain.ports import RunStore
from steptrail.domain.run import Run
from steptrail.domain.schemas import validate_input
from steptrail.projections.run_index import RunRow
from steptrail.workers.execute import (
    Executor,
    SegmentResult,
    decode_request,
)
from steptrail.workers.holders import holder_name

ResumeMode = Literal["auto", "here", "queue"]


class AlreadyResuming(IllegalTransition):
    """Somebody else decided this run first; it is already resuming."""


class DecisionExpired(IllegalTransition):
    """The wait's `timeout=` passed before the decision came (ADR 0073); nothing changed."""


class _Clocked(Protocol):
    def store_now(self) -> datetime: ...
    def row(self, run_id: UUID) -> RunRow | None: ...


_DECIDED = frozenset({WaitKind.APPROVAL, WaitKind.INPUT})


@dataclass(frozen=True)
class PendingDecision:
    """What a waiting run asks a person, with the digest a decision must quote."""

    run_id: UUID
    kind: WaitKind
    digest: str
    calls: list[PendingCall]
    input_schema: dict[str, Any] | None
    prompt: str | None


@dataclass(frozen=True)
class ResumeHere:
    """A run this process holds under a fresh `resume:` lease, ready to be executed."""

    run: Run
    request: dict[str, Any]
    resumable: dict[str, Any]
    lease_from: float | None = None  # when the resuming append was sent (ADR 0016)


class Decisions:
    """Approve, deny and submit input for waiting runs (see the module docstring)."""

    def __init__(
        self,
        store: RunStore,
        *,
        lease_ms: int,
        executor: Callable[[], Executor],
        max_input_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.store = store
        self.max_input_bytes = max_input_bytes
        self.lease_ms = lease_ms
        self.executor = executor

    def pending(self, run_id: UUID) -> PendingDecision:
        """What `run_id` waits for.

        Raises:
            UnknownRun, IllegalTransition (not waiting), CorruptResumableState.
        """
        run = self._load(run_id)
        saved = self._saved_state(run)
        waiting = run.state.waiting
        assert waiting is not None
        return PendingDecision(
            run_id=run_id,
            kind=waiting.kind,
            digest=waiting.digest,
            calls=saved.calls,
            input_schema=saved.input_schema,
            prompt=saved.prompt,
        )

    def decide(
        self,
        run_id: UUID,
        *,
        by: str,
        kind: WaitKind,
        approved: bool,
        digest: str | None = None,
        values: Mapping[str, Any] | None = None,
        resume: ResumeMode = "auto",
    ) -> SegmentResult:
        """Record a decision and resume the run (here, or through the queue).

        Returns the resumed segment's result (`here`), or a `requeued`-style result whose
        status is `queued` (`queue`).

        Raises:
            UnknownRun; IllegalTransition (not waiting for that); AlreadyResuming;
            DigestMismatch; InvalidInput (also for input too deep or too large);
            InvalidActor; CorruptResumableState.
        """
        handed = self.record(
            run_id,
            by=by,
            kind=kind,
            approved=approved,
            digest=digest,
            values=values,
            resume=resume,
        )
        if isinstance(handed, SegmentResult):
            return handed
        return self.executor().execute(
            handed.run, handed.request, resumable=handed.resumable, lease_from=handed.lease_from
        )

    def record(
        self,
        run_id: UUID,
        *,
        by: str,
        kind: WaitKind,
        approved: bool,
        digest: str | None = None,
        values: Mapping[str, Any] | None = None,
        resume: ResumeMode = "auto",
    ) -> SegmentResult | ResumeHere:
        """Record a decision and hand the run on: to the queue (a `requeued`-style result
        whose status is `queued`) or to this process (`ResumeHere`: the caller executes the
        resumed segment, in a thread or, for an async agent, on its loop).

        Raises: as `decide`.
        """
        check_actor(by)
        if values is not None:
            check_input_bounds(values, self.max_input_bytes)
        run = self._load(run_id)
        saved = self._saved_state(run)
        waiting = run.state.waiting
        assert waiting is not None
        if waiting.kind is not kind:
            raise IllegalTransition(f"run {run_id} waits for {waiting.kind}, not {kind}")
        if digest is not None and digest != waiting.digest:
            raise DigestMismatch(
                f"digest {digest} does not match the pending calls ({waiting.digest}); "
                "the run is still waiting"
            )
        new_body: bytes | None = None
        input_keys: tuple[str, ...] = ()
        if kind is WaitKind.INPUT:
            taken = validate_input(saved.input_schema or {}, values or {}, clock=time.monotonic)
            saved = saved.model_copy(update={"values": taken})
            new_body = canonical_json(saved.model_dump(mode="json"))
            input_keys = tuple(sorted(taken))
        mode = resume
        if mode == "auto":
            mode = "queue" if run.state.has_saved_request else "here"
        run.decide(
            by=by, kind=kind, approved=approved, digest=waiting.digest, input_keys=input_keys
        )
        holder = holder_name("resume")
        if mode == "here":
            run.resume(holder=holder, lease_ms=self.lease_ms)
        else:
            run.release(actor=by)
        sent = time.monotonic()  # the resumed lease is counted from here (ADR 0016)
        try:
            self.store.append(run, resumable=new_body)
        except VersionConflict:
            current = self.store.load(run_id)
            if current is not None and current.state.decision is not None:
                raise AlreadyResuming(f"run {run_id} is already resuming") from None
            status = current.status if current is not None else "gone"
            raise IllegalTransition(f"run {run_id} changed meanwhile (now {status})") from None
        if mode == "queue":
            return SegmentResult(run.id, Outcome.REQUEUED, run.status, run.version)
        request = decode_request(self.store.saved(run_id, "request") or b"")
        return ResumeHere(run, request, saved.model_dump(mode="json"), lease_from=sent)

    # -- internals -----------------------------------------------------------------------------

    def _load(self, run_id: UUID) -> Run:
        run = self.store.load(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id}")
        woke = run.state.woke
        if not run.status.is_decidable:
            if run.state.decision is not None and not run.status.is_terminal:
                raise AlreadyResuming(f"run {run_id} is already resuming ({run.status})")
            expired = woke is not None and woke.kind in _DECIDED and run.state.decision is None
            if expired and woke is not None and run.status is RunStatus.RUNNING:
                raise DecisionExpired(
                    f"the {woke.kind.value} of run {run_id} expired; it resumed without it"
                )
            raise IllegalTransition(f"run {run_id} is not waiting (it is {run.status})")
        waiting = run.state.waiting
        if waiting is not None and waiting.timeout_ms is not None:
            # Judged by the store's clock at the request (ADR 0073), as the reaper judges a
            # lease (ADR 0049): past the deadline the claim may take the run any moment.
            clocked = cast(_Clocked, self.store)
            row = clocked.row(run_id)
            deadline = row.available_at if row is not None else None
            if deadline is not None and deadline <= clocked.store_now():
                raise DecisionExpired(
                    f"the {waiting.kind.value} of run {run_id} expired at "
                    f"{deadline.isoformat()}; it resumes without it"
                )
        return run

    def _saved_state(self, run: Run) -> ResumableState:
        body = self.store.saved(run.id, "resumable")
        if body is None:
            raise CorruptResumableState(f"run {run.id} has no resumable state saved")
        try:
            saved = ResumableState.model_validate(json.loads(body))
        except (ValueError, ValidationError):
            raise CorruptResumableState(
                f"the resumable state of run {run.id} is unreadable; nothing was changed"
            ) from None
        waiting = run.state.waiting
        assert waiting is not None
        if saved.kind is not waiting.kind or state_digest(saved) != waiting.digest:
            raise CorruptResumableState(
                f"the resumable state of run {run.id} does not match what it waits on; "
                "nothing was changed"
            )
        return saved
