"""The runtime: the one bootstrap that wires settings, store, agents and workers together.

Nothing connects at import time; `open()` does, and `Runtime.close()` (or a `with` block)
lets go. Use cases are named the way an operator asks for them: enqueue, start, work, reap,
cancel, retry, get, history. The CLI and the console both act through them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic import ValidationError

from steptrail.domain.actors import check_actor
from steptrail.domain.digest import canonical_json, digest
from steptrail.domain.enums import TerminationReason, WaitKind
from steptrail.domain.errors import IllegalTransition, InvalidActor, UnknownRun, VersionConflict
from steptrail.domain.ids import ENTROPY_BYTES, time_ordered_id
from steptrail.domain.limits import ENQUEUE_BATCH, PayloadRejected, check_depth, check_size
from steptrail.domain.retry_plan import RetryPlan
from steptrail.domain.run import Run
from steptrail.infrastructure.factory import open_store
from steptrail.infrastructure.logging import set_level, steptrail_logger
from steptrail.infrastructure.projection_store import ProjectionStore
from steptrail.infrastructure.settings import Settings
from steptrail.runtime_schedules import RuntimeSchedules
from steptrail.runtime_views import RunRef, RuntimeViews
from steptrail.workers.registry import App, UnknownAgent
from steptrail.workers.store_threads import StoreThreads
from steptrail.workers.telemetry import NO_TELEMETRY, Deferred, Telemetry, compose

# The workers' machinery (executing segments, the worker loop, the reaper, decisions,
# retention, maintenance) is imported by the use case that needs it, so that a command that
# only reads (`stats`, `runs`, `show`) or enqueues does not pay for it (ADR 0051).
if TYPE_CHECKING:
    import asyncio

    import structlog
    from opentelemetry.trace import TracerProvider
    from prometheus_client.registry import CollectorRegistry

    from steptrail.infrastructure.postgres import PostgresRunStore
    from steptrail.infrastructure.sqlite import SQLiteRunStore
    from steptrail.projections.run_index import RunRow
    from steptrail.worker_metrics import WorkerMetrics
    from steptrail.workers.decisions import Decisions, PendingDecision, ResumeMode
    from steptrail.workers.execute import ExecutionConfig, Executor, SegmentResult
    from steptrail.workers.lease import LeaseKeeper
    from steptrail.workers.reaper import Reaper, ReapReport
    from steptrail.workers.retries import Retries, RetryReport
    from steptrail.workers.signals import SignalSent
    from steptrail.workers.telemetry import CreationProbe
    from steptrail.workers.worker import Worker, WorkerReport

CANCEL_ATTEMPTS = 20
MAX_KEY_LENGTH = 1000
ITEM_FIELDS = ("agent", "request", "idempotency_key", "actor", "queue", "priority")
# The hooks the worker metrics and the tracer override (the others are Telemetry's no-ops):
# made on first use, they are made by these only (tests/unit/test_cli_imports.py checks).
METRICS_HOOKS = ("claimed", "segment_started")
TRACING_HOOKS = ("run_created", "segment_started")


def new_run_id() -> UUID:
    """A new run's id: a UUID that sorts by the millisecond it was made (version 7), so the
    rows of runs made together share pages and a purge of the oldest runs walks one end of
    every table keyed by run (ADR 0052)."""
    return time_ordered_id(time.time_ns() // 1_000_000, os.urandom(ENTROPY_BYTES))


class InvalidRequest(ValueError):
    """A request cannot be enqueued as given (not JSON, or not what the agent accepts)."""


class InvalidItem(InvalidRequest):
    """One item of `enqueue_many` cannot be enqueued; nothing was written. `index` is its
    position among the items (0-based), `reason` what is wrong with it."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"item {index}: {reason}")
        self.index = index
        self.reason = reason


class Runtime(RuntimeViews, RuntimeSchedules):
    """A steptrail runtime bound to one database and one set of agents."""

    def __init__(
        self,
        app: App,
        settings: Settings,
        store: PostgresRunStore | SQLiteRunStore,
        *,
        log: structlog.typing.FilteringBoundLogger | None = None,
        telemetry: Telemetry = NO_TELEMETRY,
        metrics: WorkerMetrics | Deferred[WorkerMetrics] | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        self.store = store
        self.log = log or steptrail_logger()
        self.telemetry = telemetry
        self._metrics = metrics
        self._keeper: LeaseKeeper | None = None
        self._projections: dict[str, ProjectionStore] = {}
        self.threads = StoreThreads()

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.close()
        self.threads.close()
        self.store.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def metrics(self) -> WorkerMetrics | None:
        """This runtime's worker metrics (`metrics.registry` holds them), if it has any."""
        if isinstance(self._metrics, Deferred):
            return self._metrics.made()
        return self._metrics

    def prepare_observers(self) -> None:
        """Make the metrics and the tracer now rather than on their first use (ADR 0051
        defers them, and their imports, for commands that never run anything)."""
        self.telemetry.prepare()

    @property
    def backend(self) -> str:
        return self.store.backend

    def execution_config(self) -> ExecutionConfig:
        from steptrail.workers.execute import ExecutionConfig

        return ExecutionConfig(
            lease_s=self.settings.lease_seconds,
            policy=self.settings.retry_policy(),
            privacy=self.settings.privacy_level,
            max_payload_bytes=self.settings.max_payload_bytes,
        )

    # -- use cases -----------------------------------------------------------------------------

    def enqueue(
        self,
        agent: str,
        request: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        actor: str = "enqueue",
        queue: str | None = None,
        priority: int | None = None,
    ) -> UUID:
        """Queue a run of `agent`; returns its id (the existing run's, for a taken key).
        `queue` and `priority` default to the agent's (ADR 0077).

        Fail-closed: an unknown agent or a request that cannot be serialised (or does not
        validate against the agent's request model) raises before anything is written, and
        a failed write raises too.

        Raises:
            UnknownAgent: no agent of that name is registered.
            InvalidRequest: the request cannot be serialised or does not validate, or the
                queue or priority is not one the App accepts.
            StoreUnavailable: the write failed.
        """
        return self.enqueue_once(
            agent,
            request,
            idempotency_key=idempotency_key,
            actor=actor,
            queue=queue,
            priority=priority,
        )[0]

    def enqueue_once(
        self,
        agent: str,
        request: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        actor: str = "enqueue",
        queue: str | None = None,
        priority: int | None = None,
    ) -> tuple[UUID, bool]:
        """`enqueue`, also saying whether the run is new (False: the idempotency key's run
        existed already and is returned)."""
        body = self._checked(agent, request, idempotency_key, actor)
        placed = placement(self.app, agent, queue, priority)
        run, probe = self._new_queued(agent, body, idempotency_key, actor, placed)
        stored: Run | None = None
        try:
            stored = self.store.create(run, request=body)
        finally:
            probe.ended(duplicate=stored is not None and stored is not run)
        self.log.info(
            "run_enqueued",
            run_id=str(stored.id),
            agent=agent,
            version=stored.version,
            duplicate=stored is not run,
            **_trace_fields(stored),
        )
        return stored.id, stored is run

    def enqueue_many(
        self,
        items: Iterable[Mapping[str, Any]],
        *,
        actor: str = "enqueue",
        batch: int = ENQUEUE_BATCH,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[UUID]:
        """Queue many runs: each item a mapping with `agent`, and optionally `request`,
        `idempotency_key` and `actor` (default `actor`), as `enqueue` takes them. Returns
        each item's run id, in order (the existing run's for a taken key).

        Every item is validated before anything is written: a bad one raises
        `InvalidItem` naming its position, and nothing is written. Then the runs are
        written `batch` at a time, each batch one statement (PostgreSQL) or one transaction
        (SQLite), with the rows, creation events and saved requests `enqueue` writes, and
        idle workers are woken once per batch. Idempotency keys behave as if the items were
        enqueued one by one in order: a taken key returns its run, and a key repeated in
        `items` returns the run of its first occurrence. A failure of the store part-way
        leaves the batches before it written (enqueueing again with keys is safe).
        `progress(done, total)` is called after each batch. The checked requests of all
        items are held in memory until written: for millions of runs, call it once per
        chunk of items (as `steptrail enqueue --from` does).

        Raises:
            InvalidItem: an item is bad (its `index` says which); nothing was written.
            StoreUnavailable: a batch's write failed (the batches before it are written).
        """
        if batch < 1:
            raise ValueError("batch must be a positive integer")
        check_actor(actor)
        checked = self._checked_items(items, actor)
        first: dict[str, int] = {}  # idempotency key -> the first item that has it
        unique: list[int] = []
        for index, (_, _, key, _, _) in enumerate(checked):
            if key is None or key not in first:
                unique.append(index)
                if key is not None:
                    first[key] = index
        ids: list[UUID | None] = [None] * len(checked)
        done = 0
        for start in range(0, len(unique), batch):
            chunk = unique[start : start + batch]
            runs = [self._new_queued(*checked[i]) for i in chunk]
            stored: list[UUID] | None = None
            try:
                stored = self.store.create_many(
                    [(run, checked[i][1]) for i, (run, _) in zip(chunk, runs, strict=True)]
                )
            finally:
                for n, (run, probe) in enumerate(runs):
                    probe.ended(duplicate=stored is not None and stored[n] != run.id)
            for i, run_id in zip(chunk, stored, strict=True):
                ids[i] = run_id
            done += len(chunk)
            self.log.info(
                "runs_enqueued",
                count=len(chunk),
                duplicates=sum(1 for (run, _), s in zip(runs, stored, strict=True) if s != run.id),
            )
            if progress is not None:
                progress(done, len(unique))
        result: list[UUID] = []
        for index, (_, _, key, _, _) in enumerate(checked):
            found = ids[index] if key is None else ids[first[key]]
            assert found is not None, "every item's run was written or found"
            result.append(found)
        return result

    def _checked_items(
        self, items: Iterable[Mapping[str, Any]], actor: str
    ) -> list[tuple[str, bytes, str | None, str, tuple[str, int]]]:
        checked = []
        for index, item in enumerate(items):
            try:
                checked.append(self._checked_item(item, actor))
            except (InvalidRequest, UnknownAgent, InvalidActor) as error:
                raise InvalidItem(index, str(error)) from error
        return checked

    def check_enqueue(self, item: Mapping[str, Any], *, actor: str = "enqueue") -> None:
        """Check one `enqueue_many` item as `enqueue_many` would, writing nothing.

        Raises:
            InvalidRequest, UnknownAgent, InvalidActor: what is wrong with it.
        """
        self._checked_item(item, actor)

    def _checked(
        self, agent: str, request: Mapping[str, Any] | None, key: str | None, actor: str
    ) -> bytes:
        """The request's stored body, once the agent, request, key and actor are checked."""
        return checked_enqueue(self.app, self.settings, agent, request, key=key, actor=actor)

    def _checked_item(
        self, item: Mapping[str, Any], actor: str
    ) -> tuple[str, bytes, str | None, str, tuple[str, int]]:
        if not isinstance(item, Mapping):
            raise InvalidRequest("an item must be an object with an agent and a request")
        unknown = sorted(str(k) for k in item if k not in ITEM_FIELDS)
        if unknown:
            raise InvalidRequest(
                f"unknown field {unknown[0][:80]!r} (an item has {', '.join(ITEM_FIELDS)})"
            )
        agent = item.get("agent")
        if not isinstance(agent, str):
            raise InvalidRequest("an item needs an agent (a string)")
        key = item.get("idempotency_key")
        if key is not None and not isinstance(key, str):
            raise InvalidRequest("an idempotency key must be a string")
        who = item.get("actor", actor)
        if not isinstance(who, str):
            raise InvalidRequest("an actor must be a string")
        body = self._checked(agent, item.get("request"), key, who)
        placed = placement(self.app, agent, item.get("queue"), item.get("priority"))
        return agent, body, key, who, placed

    def _new_queued(
        self,
        agent: str,
        body: bytes,
        key: str | None,
        actor: str,
        placed: tuple[str, int] = ("default", 0),
    ) -> tuple[Run, CreationProbe]:
        """A new queued run for a checked request body, with its telemetry probe."""
        run_id = new_run_id()
        probe = self.telemetry.run_created(agent=agent, run_id=run_id, how="enqueue")
        run = Run.enqueue(
            run_id=run_id,
            agent=agent,
            request_digest=digest(json.loads(body)),
            actor=actor,
            idempotency_key=key,
            trace_parent=probe.trace_parent,
            queue=placed[0],
            priority=placed[1],
        )
        return run, probe

    def start(self, agent: str, request: Mapping[str, Any] | None = None) -> SegmentResult:
        """Run `agent` now, in this process, as an interactive run under an
        `interactive:` lease. It heartbeats like a worker; it is never retried, and if this
        process dies the reaper dead-letters it (it has no saved request to run again)."""
        run, body, sent = self.begin_interactive(agent, request)
        return self._executor().execute(run, body, lease_from=sent)

    def begin_interactive(
        self, agent: str, request: Mapping[str, Any] | None
    ) -> tuple[Run, dict[str, Any], float]:
        """Record an interactive run's start, held by this process; returns it, its request
        and when its lease was sent (`time.monotonic()`), ready to execute (`start` does;
        the async runtime awaits it)."""
        from steptrail.workers.holders import holder_name

        body = self._request_body(agent, request)
        run_id = new_run_id()
        probe = self.telemetry.run_created(agent=agent, run_id=run_id, how="start")
        run = Run.start(
            run_id=run_id,
            agent=agent,
            request_digest=digest(json.loads(body)),
            holder=holder_name("interactive"),
            lease_ms=self.settings.lease_ms,
            trace_parent=probe.trace_parent,
        )
        sent = time.monotonic()  # the lease is counted from here (ADR 0016)
        try:
            self.store.create(run, request=None)
        finally:
            probe.ended()
        value: dict[str, Any] = json.loads(body)
        return run, value, sent

    def worker(
        self,
        *,
        concurrency: int = 1,
        burst: bool = False,
        on_result: Callable[[SegmentResult], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        queues: Iterable[str] | None = None,
    ) -> Worker:
        """A worker over this runtime's store and agents (call `.run()`, `.stop()`).

        Runs of async agents share one event loop: `loop` if given (it must be running in
        another thread), else one the worker starts for them. `queues`: claim only runs of
        these (each one of the App's queues, else UnknownQueue); None: of every queue."""
        from steptrail.workers.worker import Worker

        served = None if queues is None else self.app.check_queues(queues)

        return Worker(
            self.store,
            self.app,
            self.execution_config(),
            concurrency=concurrency,
            burst=burst,
            poll_interval=self.settings.poll_interval,
            log=self.log,
            on_result=on_result,
            loop=loop,
            telemetry=self.telemetry,
            queues=served,
        )

    def work(
        self, *, concurrency: int = 1, burst: bool = False, queues: Iterable[str] | None = None
    ) -> WorkerReport:
        """Claim and execute runs until stopped (burst: until no run is ready), of `queues`
        only if given (see `worker`)."""
        return self.worker(concurrency=concurrency, burst=burst, queues=queues).run()

    def reaper(self) -> Reaper:
        from steptrail.workers.holders import holder_name
        from steptrail.workers.reaper import Reaper

        return Reaper(
            self.store, self.settings.retry_policy(), actor=holder_name("reaper"), log=self.log
        )

    def reap(self, limit: int = 50) -> ReapReport:
        """One reaper pass over at most `limit` stale runs."""
        return self.reaper().reap_once(limit)

    def cancel(self, run_id: RunRef, *, by: str = "operator", note: str | None = None) -> RunRow:
        """Cancel a queued, running or waiting run. A worker running it stops at its next
        step boundary with outcome `cancelled`.

        Raises:
            UnknownRun: no such run.
            IllegalTransition: the run already ended.
            InvalidActor: `by` is not an acceptable actor name.
        """
        check_actor(by)
        run_id = self.resolve(run_id)
        for _ in range(CANCEL_ATTEMPTS):
            run = self.store.load(run_id)
            if run is None:
                raise UnknownRun(f"no run {run_id}")
            run.cancel(actor=by, note=note)
            try:
                self.store.append(run)
            except VersionConflict:
                continue  # the holder appended a step meanwhile; cancel the newer state
            self.log.info("run_cancelled", run_id=str(run_id), by=by, version=run.version)
            return self.get(run_id)
        raise IllegalTransition(f"run {run_id} kept changing; cancel did not land")

    def set_priority(self, run_id: RunRef, priority: int, *, by: str = "operator") -> RunRow:
        """Change the claim priority of a queued or waiting run (ADR 0077); nothing is
        written when it has that priority already.

        Raises:
            InvalidRequest: the priority is not an integer in range; nothing written.
            UnknownRun: no such run.
            IllegalTransition: the run is running or settled.
        """
        from steptrail.workers.queues import set_priority

        run_id = self.resolve(run_id)
        try:
            set_priority(self.store, run_id, priority, actor=by, log=self.log)
        except ValueError as error:
            raise InvalidRequest(str(error)) from None
        return self.get(run_id)

    def signal(
        self, run_id: RunRef, name: str, payload: Any = None, *, by: str = "api"
    ) -> SignalSent:
        """Deliver the signal `name` with `payload` to a run (ADR 0073). A run waiting for it
        in `ctx.wait_event(name)` is queued at once; otherwise it is kept, in order, for the
        run's next wait for that name.

        Raises:
            UnknownRun: no such run.
            IllegalTransition: the run has settled; nothing is written.
            InvalidInput: the payload is too deep, too large, not JSON, or not the declared schema.
            InvalidActor: `by` is not an acceptable actor name.
            ValueError: `name` is not a signal name.
        """
        from steptrail.workers.signals import Signals

        run_id = self.resolve(run_id)
        return Signals(
            self.store,
            max_payload_bytes=self.settings.max_payload_bytes,
            schemas=self.app.signal_schemas,
            log=self.log,
        ).send(run_id, name, payload, by=by)

    def retries(self) -> Retries:
        from steptrail.workers.retries import Retries

        return Retries(self.store, self.log, self._unknown)

    def retry(
        self,
        run_id: RunRef,
        *,
        by: str,
        reset_budget: bool = False,
        force: bool = False,
        from_position: int | None = None,
    ) -> RunRow:
        """Put a failed run (dead-lettered or not) back on the queue, recorded as
        `Run.Retried` with `by`. Its requeue budget carries on unless `reset_budget`.

        The run kept its saved request and step journal when it failed (ADR 0070), so the
        worker that takes it replays every recorded step (writes are not repeated, model
        calls not paid again) and runs on from the step that failed. With `from_position`
        N, steps 1..N-1 replay and N on run again (their journal entries are dropped in the
        same fenced append).

        Raises:
            UnknownRun: no such run.
            PendingWrite: a non-idempotent write's outcome is unknown (a marker without a
                result), or a recorded one is at or after `from_position` (pass `force`).
            InvalidRetryPosition: `from_position` is below 1 or past the recorded steps + 1.
            AlreadyRetried: somebody else retried it first; nothing was written.
            IllegalTransition: the run is not failed, or has no saved request.
            InvalidActor: `by` is not an acceptable actor name.
        """
        run_id = self.resolve(run_id)
        self.retries().retry(
            run_id, by=by, reset_budget=reset_budget, force=force, from_position=from_position
        )
        return self.get(run_id)

    def retry_plan(self, run_id: RunRef, *, from_position: int | None = None) -> RetryPlan:
        """What `retry` would do now (nothing is written): the step it runs again from, and
        the recorded non-idempotent writes that repeats (which need `force`).

        Raises:
            UnknownRun: no such run.
            InvalidRetryPosition: `from_position` is out of the journal's range.
        """
        return self.retries().plan(self.resolve(run_id), from_position=from_position)[1]

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
        return self.retries().retry_many(
            by=by,
            since=since,
            agent=agent,
            reason=reason,
            reset_budget=reset_budget,
            force=force,
            limit=limit,
        )

    # -- people in the loop --------------------------------------------------------------------

    def decisions(self) -> Decisions:
        from steptrail.workers.decisions import Decisions

        return Decisions(
            self.store,
            lease_ms=self.settings.lease_ms,
            executor=self._executor,
            max_input_bytes=self.settings.max_payload_bytes,
        )

    def pending(self, run_id: RunRef) -> PendingDecision:
        """What a waiting run waits for, with the digest a decision must quote."""
        return self.decisions().pending(self.resolve(run_id))

    def approve(
        self, run_id: RunRef, *, by: str, digest: str | None = None, resume: ResumeMode = "auto"
    ) -> SegmentResult:
        """Approve the pending calls of a run waiting for approval, and resume it.

        `resume="here"` runs the resumed segment in this process (under a `resume:` lease)
        and returns its result; `"queue"` hands the run to the queue for a worker; `"auto"`
        (default) queues a run that came from the queue and resumes an interactive one here.
        `digest`, if given, must match the pending calls (`steptrail show` prints it).
        """
        return self.decisions().decide(
            self.resolve(run_id),
            by=by,
            kind=WaitKind.APPROVAL,
            approved=True,
            digest=digest,
            resume=resume,
        )

    def deny(
        self, run_id: RunRef, *, by: str, digest: str | None = None, resume: ResumeMode = "auto"
    ) -> SegmentResult:
        """Deny the pending calls: each gets the error result "denied by the operator" and
        the agent continues (resumed as with `approve`)."""
        return self.decisions().decide(
            self.resolve(run_id),
            by=by,
            kind=WaitKind.APPROVAL,
            approved=False,
            digest=digest,
            resume=resume,
        )

    def submit_input(
        self,
        run_id: RunRef,
        values: Mapping[str, Any],
        *,
        by: str,
        resume: ResumeMode = "auto",
    ) -> SegmentResult:
        """Submit input to a run waiting for it. The values are validated against the
        declared schema before anything changes; only declared keys are kept; the event
        records who submitted and which keys, never the values."""
        return self.decisions().decide(
            self.resolve(run_id),
            by=by,
            kind=WaitKind.INPUT,
            approved=True,
            values=values,
            resume=resume,
        )

    def _request_body(self, agent: str, request: Mapping[str, Any] | None) -> bytes:
        return request_body(self.app, self.settings, agent, request)

    def executor(self) -> Executor:
        """The executor of segments this process runs itself (start, resume `here`)."""
        return self._executor()

    def _executor(self) -> Executor:
        from steptrail.workers.execute import Executor
        from steptrail.workers.lease import LeaseKeeper

        if self._keeper is None:
            self._keeper = LeaseKeeper(self.settings.lease_seconds)
        return Executor(
            self.store,
            self.app,
            self.execution_config(),
            keeper=self._keeper,
            log=self.log,
            threads=self.threads,
            telemetry=self.telemetry,
        )


def combined_app(app: App | None) -> App:
    """`app`'s agents with the built-in ones (`scripted`...), as a runtime serves them."""
    from steptrail.examples import app as examples

    combined = App()
    combined.include(examples)
    if app is not None:
        combined.include(app)
    return combined


def checked_enqueue(
    app: App,
    settings: Settings,
    agent: str,
    request: Mapping[str, Any] | None,
    *,
    key: str | None,
    actor: str,
) -> bytes:
    """The stored body of a request to enqueue, once the agent, request, idempotency key and
    actor are checked: what `Runtime.enqueue` checks, needing no database (the command line
    checks before it opens one, so bad input creates nothing, not even a schema).

    Raises:
        UnknownAgent: no agent of that name in `app`.
        InvalidRequest: the request, or the key, is not acceptable.
        InvalidActor: `actor` is not an acceptable actor name.
    """
    body = request_body(app, settings, agent, request)
    if key is not None and (not isinstance(key, str) or not key.strip()):
        raise InvalidRequest("an idempotency key cannot be blank")
    if key is not None and len(key) > MAX_KEY_LENGTH:
        raise InvalidRequest(f"an idempotency key has at most {MAX_KEY_LENGTH} characters")
    check_actor(actor)
    return body


def placement(app: App, agent: str, queue: Any, priority: Any) -> tuple[str, int]:
    """A new run's (queue, priority): those given, else the agent's (ADR 0077).

    Raises:
        UnknownAgent: no agent of that name in `app`.
        InvalidRequest: a malformed or unknown queue, a priority out of range.
    """
    try:
        return app.placement(agent, queue, priority)
    except ValueError as error:
        raise InvalidRequest(str(error)) from None


def request_body(
    app: App, settings: Settings, agent: str, request: Mapping[str, Any] | None
) -> bytes:
    """The canonical JSON a request is stored as, once checked against the agent's model
    and the size and depth limits."""
    spec = app.get(agent)
    value: Any = {} if request is None else request
    if not isinstance(value, Mapping):
        raise InvalidRequest("a request must be a JSON object")
    try:
        check_depth(value, "the request")
    except PayloadRejected as error:
        raise InvalidRequest(str(error)) from error
    if spec.request_model is not None:
        try:
            value = spec.request_model.model_validate(value).model_dump(
                mode="json", by_alias=True, exclude_unset=True
            )
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}"
                for e in error.errors()
            )
            raise InvalidRequest(f"invalid request for {agent!r}: {problems}") from error
    try:
        body = canonical_json(dict(value))
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidRequest(f"the request cannot be serialised as JSON: {error}") from error
    try:
        check_size(len(body), settings.max_request_bytes, "the request")
    except PayloadRejected as error:
        raise InvalidRequest(f"{error} (STEPTRAIL_MAX_REQUEST_BYTES)") from error
    return body


def open_runtime(
    app: App | None = None,
    *,
    url: str | None = None,
    settings: Settings | None = None,
    ensure_schema: bool = True,
    telemetry: Telemetry | None = None,
    metrics_registry: CollectorRegistry | None = None,
    tracer_provider: TracerProvider | None = None,
    one_shot: bool = False,
    may_migrate: bool = True,
    **overrides: Any,
) -> Runtime:
    """Open a runtime: read settings, connect, migrate the schema if needed.

    Args:
        app: your agents; the built-in scripted agent is always included.
        url: the database URL (else `settings.database_url`, i.e. `STEPTRAIL_DATABASE_URL`,
            default `sqlite:///steptrail.db`).
        settings: explicit settings (else read from the environment).
        ensure_schema: check (and with auto-migrate, create or upgrade) the schema; False
            only for a caller that migrates itself (`steptrail migrate`).
        telemetry: more observers of the runtime's runs (see `steptrail.workers.telemetry`);
            worker metrics and, when `settings.tracing` allows, OpenTelemetry tracing are
            always wired in besides.
        metrics_registry: the Prometheus registry the worker metrics register in (default:
            a private one, `Runtime.metrics.registry`).
        tracer_provider: the OpenTelemetry tracer provider for run traces (default: the
            global one; setting `tracing=off` turns tracing off either way).
        one_shot: the runtime serves one command and is closed after it (the CLI's reads,
            `enqueue`, `reap`...): on PostgreSQL it keeps one connection instead of opening
            a pool (another is opened only while that one is busy).
        may_migrate: False for a caller that only reads (the CLI's `runs`, `show`...): a
            missing or older schema raises SchemaMissing instead of being created or
            upgraded, and a SQLite file that does not exist is not created (ADR 0074).
        overrides: individual settings, e.g. `lease_seconds=5`.

    Raises:
        ValueError: a bad database URL (InvalidSettings: a bad setting, naming it).
        StoreUnavailable: the database cannot be reached.
        SchemaMissing: the schema is missing or behind, and auto-migrate is off or
            `may_migrate` is False.
    """
    if settings is None:
        settings = Settings(**overrides)
    elif overrides:
        settings = Settings(**{**settings.model_dump(), **overrides})
    if "log_level" in settings.model_fields_set:
        # Only the level, and only when it was asked for: where records go is the host's
        # choice (its logging configuration), never ours (ADR 0021).
        set_level(settings.log_level)
    combined = combined_app(app)
    metrics: WorkerMetrics | Deferred[WorkerMetrics]
    if metrics_registry is not None:  # registered now: a clash in it raises here
        from steptrail.worker_metrics import WorkerMetrics

        metrics = WorkerMetrics(metrics_registry)
    else:  # a private registry: made (prometheus_client imported) when first used
        metrics = Deferred(_private_metrics, METRICS_HOOKS)
    tracing = _tracing(settings, tracer_provider)
    store = open_store(
        url or settings.database_url,
        migrate=settings.auto_migrate and may_migrate,
        ensure_schema=ensure_schema,
        one_shot=one_shot,
    )
    observers = compose(metrics, tracing, telemetry)
    return Runtime(combined, settings, store, telemetry=observers, metrics=metrics)


def _private_metrics() -> WorkerMetrics:
    from steptrail.worker_metrics import WorkerMetrics

    return WorkerMetrics()


def _tracing(settings: Settings, provider: TracerProvider | None) -> Telemetry | None:
    """OpenTelemetry tracing if the settings allow it and the API is installed (ADR 0031).

    Raises:
        ValueError: `tracing=on` without the `opentelemetry-api` package.
    """
    if settings.tracing == "off":
        return None
    from importlib.util import find_spec

    try:
        installed = find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # no `opentelemetry` package, or a blocked one
        installed = False
    if not installed:
        if settings.tracing == "on":
            raise ValueError("tracing=on needs the OpenTelemetry API: pip install steptrail[otel]")
        return None
    if provider is None:  # the global provider, taken when the first run is traced
        return Deferred(_global_tracing, TRACING_HOOKS)
    from steptrail.tracing import Tracing

    return Tracing(provider)


def _global_tracing() -> Telemetry:
    from steptrail.tracing import Tracing

    return Tracing()


def _trace_fields(run: Run) -> dict[str, str]:
    trace_id = run.state.trace_id
    return {"trace_id": trace_id} if trace_id is not None else {}
