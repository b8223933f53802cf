"""Replay check before deploy: would the current agent code replay recorded runs? (ADR 0036)

Each run's journal is replayed against the agent function as it is now, in a replay-only
context: every step call must be answered from the journal; the first call beyond it ends the
check for that run (it is where the run would go on live), so no step function, tool or model
call ever runs and nothing is written. A call that does not match the journal (kind, name,
argument fingerprint) is exactly what would fail the run `non_deterministic`; for a run
waiting for a person, the pending calls the agent asks approval for must also still match
the digest the decision will quote.

The journal is deleted when a run settles, so the check covers runs in flight: waiting for a
person, queued for a retry, or running. `save_fixture` writes one such run (state, request,
resumable state, journal and trail) to a JSON file that `replay_fixture` checks in a test
suite, with no database.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar, cast
from uuid import UUID

import structlog

from steptrail.domain.enums import PrivacyLevel, RunStatus
from steptrail.domain.journal import (
    JournalCursor,
    JournalEntry,
    NonDeterministic,
    StepCall,
    fingerprint,
)
from steptrail.domain.ports import ClaimedRun, ClaimRequest, RunStore
from steptrail.domain.run import DECISION_STEP, Run, RunState
from steptrail.render import event_dict
from steptrail.runtime import Runtime
from steptrail.workers.async_context import AsyncRunContext
from steptrail.workers.context import RunContext
from steptrail.workers.execute import decode_request, run_to_end
from steptrail.workers.registry import App, UnknownAgent
from steptrail.workers.segment import Segment
from steptrail.workers.store_threads import StoreThreads

T = TypeVar("T")

FIXTURE_FORMAT = "steptrail-replay-fixture/1"
IN_FLIGHT = (
    RunStatus.WAITING_FOR_APPROVAL,
    RunStatus.WAITING_FOR_INPUT,
    RunStatus.QUEUED,
    RunStatus.RUNNING,
)


@dataclass(frozen=True)
class ReplayVerdict:
    """How one run replays: `ok`, `non_deterministic` (with the position and both steps),
    `error` (the agent raised during replay), or `skipped` (no journal, unknown agent)."""

    run_id: str
    agent: str
    status: str
    verdict: str
    replayed: int
    recorded: int
    position: int | None = None
    expected: str | None = None
    found: str | None = None
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict in ("non_deterministic", "error")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ReplayEnded(BaseException):  # not an agent error: nothing may catch it
    """The agent asked for a step beyond the journal: the replay check stops there."""

    def __init__(self, call: StepCall) -> None:
        super().__init__(call.describe())
        self.call = call


class ReplayOnlyCursor(JournalCursor):
    """A cursor that never lets a step run: beyond the journal it raises `ReplayEnded`."""

    def go_live(self, position: int) -> None:
        super().go_live(position)
        raise ReplayEnded(StepCall("resume", "by hand", ""))

    def next(self, call: StepCall) -> JournalEntry | None:
        entry = super().next(call)
        if entry is None:
            raise ReplayEnded(call)
        return entry


class _WouldWrite(BaseException):
    """Something tried to append during a replay check (it never should)."""


class _ReadOnlyStore:
    def append(
        self, run: Run, *, resumable: bytes | None = None, then_claim: ClaimRequest | None = None
    ) -> list[ClaimedRun]:
        raise _WouldWrite(f"replay check tried to append to run {run.id}")

    def __getattr__(self, name: str) -> Any:
        raise _WouldWrite(f"replay check tried store.{name}")


class _Inline:
    """Store calls of an async agent under a replay check, made in the calling thread: the
    read-only store answers (or refuses) at once, and nothing waits on I/O."""

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return fn(*args, **kwargs)


def replay_run(
    app: App,
    run: Run,
    *,
    request: dict[str, Any],
    journal: list[JournalEntry],
    resumable: dict[str, Any] | None = None,
) -> ReplayVerdict:
    """Replay `run`'s journal against `app`'s agent of the same name, executing nothing."""
    state = run.state
    cursor = ReplayOnlyCursor(journal)

    def verdict(kind: str, **more: Any) -> ReplayVerdict:
        return ReplayVerdict(
            run_id=str(run.id),
            agent=state.agent,
            status=state.status.value,
            verdict=kind,
            replayed=cursor.replayed,
            recorded=cursor.recorded,
            **more,
        )

    try:
        spec = app.get(state.agent)
    except UnknownAgent:
        return verdict("skipped", message=f"no agent {state.agent!r} in this app")
    if cursor.recorded == 0:
        return verdict("skipped", message="no journal to replay")
    log = structlog.get_logger("steptrail.replay_check")
    segment = Segment(
        cast(RunStore, _ReadOnlyStore()), run, lease_s=3600.0, log=log, clock=lambda: 0.0
    )
    ctx = RunContext(
        segment,
        request=request,
        privacy=spec.privacy or PrivacyLevel.METADATA,  # nothing is recorded anyway
        effect_of=app.effect_of,
        resumable=resumable,
        journal=cursor,
        classify=app.classifier,
    )
    try:
        if spec.is_async:  # the same core, awaited through the async context's steps
            agent = AsyncRunContext(ctx, cast(StoreThreads, _Inline()))
            run_to_end(cast(Any, spec.fn)(agent, request))
        else:
            cast(Any, spec.fn)(ctx, request)
    except ReplayEnded as ended:
        mismatch = _decision_mismatch(state, ended.call, cursor.position)
        if mismatch is not None:
            return _diverged(verdict, mismatch)
        if ctx.diverged is not None:
            return _diverged(verdict, ctx.diverged)
        return verdict("ok", message=f"replays to step {cursor.position - 1}; next {ended}")
    except NonDeterministic as error:
        return _diverged(verdict, error)
    except _WouldWrite as error:
        return verdict("error", message=str(error))
    except Exception as error:  # noqa: BLE001 - reported: the agent raised during replay
        if ctx.diverged is not None:
            return _diverged(verdict, ctx.diverged)
        return verdict("error", message=f"{type(error).__name__}: {error}")
    if ctx.diverged is not None:
        return _diverged(verdict, ctx.diverged)
    return verdict("ok", message="the agent finishes on replay")


def _decision_mismatch(state: RunState, call: StepCall, position: int) -> NonDeterministic | None:
    """For a waiting run: the agent now asks a different question than the one pending."""
    waiting = state.waiting
    if waiting is None or state.status not in IN_FLIGHT[:2] or call.kind != DECISION_STEP:
        return None
    expected = StepCall(DECISION_STEP, waiting.kind.value, fingerprint(waiting.digest))
    return None if call == expected else NonDeterministic(position, expected, call)


def _diverged(verdict: Any, error: NonDeterministic) -> ReplayVerdict:
    return cast(
        ReplayVerdict,
        verdict(
            "non_deterministic",
            position=error.position,
            expected=error.expected.describe(),
            found=error.found.describe(),
            message=str(error),
        ),
    )


def _inputs(store: RunStore, run: Run) -> tuple[dict[str, Any], dict[str, Any] | None]:
    request = decode_request(store.saved(run.id, "request") or b"")
    body = store.saved(run.id, "resumable") if run.state.has_resumable_state else None
    resumable = json.loads(body) if body else None
    return request, resumable if isinstance(resumable, dict) else None


def replay_check(
    runtime: Runtime,
    app: App | None = None,
    *,
    status: RunStatus | str | None = None,
    limit: int = 100,
) -> list[ReplayVerdict]:
    """Replay the journals of up to `limit` in-flight runs (of `status`, else every in-flight
    status) against `app` (default: the runtime's agents), executing nothing."""
    if limit < 1:
        raise ValueError("limit must be a positive integer")
    statuses = [RunStatus(status)] if status else list(IN_FLIGHT)
    app = app or runtime.app
    store = cast(RunStore, runtime.store)
    verdicts: list[ReplayVerdict] = []
    for wanted in statuses:
        for row in runtime.runs(status=wanted, limit=limit - len(verdicts)):
            run = store.load(row.run_id)
            if run is None or run.state.agent not in app.agent_names:
                continue
            request, resumable = _inputs(store, run)
            journal = store.journal(run.id)
            verdicts.append(
                replay_run(app, run, request=request, journal=journal, resumable=resumable)
            )
            if len(verdicts) >= limit:
                return verdicts
    return verdicts


# -- fixture files -----------------------------------------------------------------------------


def save_fixture(runtime: Runtime, run_id: UUID, path: str | Path) -> Path:
    """Write an in-flight run (state, request, resumable state, journal, trail) to `path`.

    Raises:
        ValueError: the run has no journal (it settled, or recorded no step yet).
    """
    store = cast(RunStore, runtime.store)
    run = store.load(run_id)
    if run is None:
        raise ValueError(f"no run {run_id}")
    journal = store.journal(run_id)
    if not journal:
        raise ValueError(f"run {run_id} has no journal (settled runs keep none)")
    request, resumable = _inputs(store, run)
    body = {
        "format": FIXTURE_FORMAT,
        "state": run.state.model_dump(mode="json"),
        "request": request,
        "resumable": resumable,
        "journal": [
            {
                "seq": e.seq,
                "position": e.position,
                "kind": e.kind,
                "name": e.name,
                "fingerprint": e.fingerprint,
                "outcome": json.loads(e.outcome()),
            }
            for e in journal
        ],
        "trail": [event_dict(h) for h in runtime.history(run_id)],
    }
    target = Path(path)
    target.write_text(json.dumps(body, indent=2, default=str) + "\n")
    return target


def replay_fixture(app: App, path: str | Path) -> ReplayVerdict:
    """Replay a run saved by `save_fixture` against `app`, with no database."""
    body = json.loads(Path(path).read_text())
    if body.get("format") != FIXTURE_FORMAT:
        raise ValueError(f"{path} is not a {FIXTURE_FORMAT} file")
    run = Run(RunState.model_validate(body["state"]))
    journal = [
        JournalEntry.from_row(
            seq=e["seq"],
            position=e["position"],
            kind=e["kind"],
            name=e["name"],
            fingerprint=e["fingerprint"],
            outcome=json.dumps(e["outcome"]).encode(),
        )
        for e in body["journal"]
    ]
    return replay_run(
        app, run, request=body["request"], journal=journal, resumable=body.get("resumable")
    )
