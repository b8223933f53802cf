"""The runtime: the one bootstrap that wires settings, store, agents and workers together.

Nothing connects at import time; `open()` does, and `Runtime.close()` (or a `with` block)
lets go. Use cases are named the way an operator asks for them: enqueue, start, work, reap,
cancel, retry, get, history. The CLI and the console both act through them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from steptrail.domain.actors import check_actor
from steptrail.domain.children import PARENT_ACTOR
from steptrail.domain.digest import digest
from steptrail.domain.enums import TerminationReason, WaitKind
from steptrail.domain.errors import IllegalTransition, UnknownRun, VersionConflict
from steptrail.domain.retry_plan import RetryPlan
from steptrail.domain.run import Run
from steptrail.infrastructure.factory import open_store
from steptrail.infrastructure.logging import set_level, steptrail_logger
from steptrail.infrastructure.projection_store import ProjectionStore
from steptrail.infrastructure.settings import Settings
from steptrail.runtime_enqueue import (
    ITEM_FIELDS,
    MAX_KEY_LENGTH,
    InvalidItem,
    InvalidRequest,
    RuntimeEnqueue,
    checked_enqueue,
    combined_app,
    new_run_id,
    placement,
    request_body,
)
from steptrail.runtime_schedules import RuntimeSchedules
from steptrail.runtime_views import RunRef, RuntimeViews
from steptrail.workers.registry import App
from steptrail.workers.store_threads import StoreThreads
from steptrail.workers.telemetry import NO_TELEMETRY, Deferred, Telemetry, compose

# The workers' machinery (executing segments, the worker loop, the reaper, decisions,
# retention, maintenance) is imported by the use case that needs it, so that a command that
# only reads (`stats`, `runs`, `show`) or enqueues does not pay for it (ADR 0051).
if TYPE_CHECKING:
    import asyncio
    from uuid import UUID

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
    from steptrail.workers.worker import Worker, WorkerReport

CANCEL_ATTEMPTS = 20
# The hooks the worker metrics and the tracer override (the others are Telemetry's no-ops):
# made on first use, they are made by these only (tests/unit/test_cli_imports.py checks).
METRICS_HOOKS = ("claimed", "segment_started")
TRACING_HOOKS = ("run_created", "segment_started")


class Runtime(RuntimeEnqueue, RuntimeViews, RuntimeSchedules):
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
            max_request_bytes=self.settings.max_request_bytes,
        )

    # -- use cases -----------------------------------------------------------------------------

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
        worker = Worker(
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
        # A worker uses its metrics and tracer at its first claim: made now, their imports
        # (prometheus_client alone is ~20 ms) are not paid between that claim and the start
        # of the runs it took (ADR 0091). Commands that never build a worker still skip them.
        self.prepare_observers()
        return worker

    def work(
        self, *, concurrency: int = 1, burst: bool = False, queues: Iterable[str] | None = None
    ) -> WorkerReport:
        """Claim and execute runs until stopped (burst: until no run is ready, waiting for
        runs held back by a key's limit or asleep on a rate limit due within 60 s), of `queues`
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

    def cancel(
        self,
        run_id: RunRef,
        *,
        by: str = "operator",
        note: str | None = None,
        keep_children: bool = False,
    ) -> RunRow:
        """Cancel a queued, running or waiting run. A worker running it stops at its next
        step boundary with outcome `cancelled`. Its unfinished child runs are cancelled
        too, recursively, each recorded as cancelled by `parent:<its parent's id>`, after
        the run itself (ADR 0075); `keep_children` leaves them be.

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
            if not keep_children:
                self._cancel_children(run_id)
            return self.get(run_id)
        raise IllegalTransition(f"run {run_id} kept changing; cancel did not land")

    def _cancel_children(self, run_id: UUID) -> None:
        """Cancel the unfinished children of a cancelled run, each in its own transaction
        (children are locked after their parent has settled: no lock is held across)."""
        for child in self.store.children(run_id):
            if child.status.is_terminal:
                continue
            with suppress(IllegalTransition):  # it settled meanwhile: nothing to cancel
                self.cancel(child.run_id, by=f"{PARENT_ACTOR}{run_id}")

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


__all__ = [  # what moved to runtime_enqueue, still importable from here
    "ITEM_FIELDS",
    "MAX_KEY_LENGTH",
    "InvalidItem",
    "InvalidRequest",
    "Runtime",
    "checked_enqueue",
    "combined_app",
    "new_run_id",
    "open_runtime",
    "placement",
    "request_body",
]
