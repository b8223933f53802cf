"""The `steptrail` command line.

Exit codes: 0 success; 1 the run is unknown or cannot do that now (e.g. cancel a finished
run); 2 bad input (unknown agent, malformed JSON, bad option or URL), nothing written; 3 the
database cannot be reached or its schema is missing.
"""

from __future__ import annotations

import importlib
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn, TypeVar
from uuid import UUID

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from steptrail.domain.enums import RunStatus, TerminationReason
from steptrail.domain.errors import (
    DigestMismatch,
    IllegalTransition,
    InvalidInput,
    StoreUnavailable,
    UnknownRun,
)
from steptrail.infrastructure.factory import SchemaMissing
from steptrail.infrastructure.logging import configure_logging
from steptrail.infrastructure.settings import Settings
from steptrail.render import event_dict, print_run, row_dict, runs_table, trail_table
from steptrail.runtime import InvalidRequest, Runtime, open_runtime
from steptrail.workers.decisions import CorruptResumableState
from steptrail.workers.registry import App, UnknownAgent

cli = typer.Typer(
    name="steptrail",
    help=(
        "Durable, event-sourced runs for LLM agents. Every run is an append-only event log; "
        "workers claim runs under a lease renewed at every step; the reaper reclaims runs "
        "whose worker died. Configure with STEPTRAIL_* variables (see README)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(soft_wrap=True)
err = Console(stderr=True)
T = TypeVar("T")


@dataclass
class Options:
    app_ref: str | None
    database_url: str | None


def fail(message: str, code: int) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def load_app(ref: str) -> App:
    """The App at `module:attribute` (an App, or a callable returning one)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        fail(f"--app must look like module:attribute, not {ref!r}", 2)
    sys.path.insert(0, ".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        fail(f"cannot import {module_name!r}: {error}", 2)
    target = getattr(module, attr, None)
    if callable(target) and not isinstance(target, App):
        target = target()
    if not isinstance(target, App):
        fail(f"{ref} is not a steptrail.App", 2)
    return target


@contextmanager
def runtime(ctx: typer.Context, **overrides: Any) -> Iterator[Runtime]:
    """Open the runtime the global options describe, turning known failures into exits."""
    options: Options = ctx.obj
    try:
        settings = Settings(**overrides)
        if options.database_url:
            settings.database_url = options.database_url
        configure_logging(settings.log_format, settings.log_level)
        app = load_app(options.app_ref) if options.app_ref else None
        rt = open_runtime(app, settings=settings)
    except ValueError as error:
        fail(str(error).splitlines()[0], 2)
    except (StoreUnavailable, SchemaMissing) as error:
        fail(f"the database is not available: {error}", 3)
    try:
        yield rt
    except (UnknownAgent, InvalidRequest, InvalidInput) as error:
        fail(str(error), 2)
    except (UnknownRun, IllegalTransition, DigestMismatch, CorruptResumableState) as error:
        fail(str(error), 1)
    except StoreUnavailable as error:
        fail(f"the database is not available: {error}", 3)
    finally:
        rt.close()


@contextmanager
def progress_bars(describe: Callable[[str], str]) -> Iterator[Callable[[str, int, int], None]]:
    """Progress bars on stderr, one per named task; yields `advance(name, done, total)`."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=err, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def advance(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(describe(name), total=total or None)
            bar.update(tasks[name], completed=done, total=max(total, done) or None)

        yield advance


def parse_run_id(value: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a run id (a UUID)") from None


def emit_json(data: Any) -> None:
    out.print_json(json.dumps(data, default=str))


@cli.callback()
def main_options(
    ctx: typer.Context,
    app: Annotated[
        str | None,
        typer.Option(
            "--app",
            envvar="STEPTRAIL_APP",
            metavar="MODULE:ATTR",
            help="Your agents: a steptrail.App at module:attribute (the built-in `scripted` "
            "agent is always there).",
        ),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            metavar="URL",
            help="sqlite:///path.db or postgresql://user@host/db "
            "(default: $STEPTRAIL_DATABASE_URL, else sqlite:///steptrail.db).",
        ),
    ] = None,
) -> None:
    ctx.obj = Options(app_ref=app, database_url=database_url)


@cli.command()
def migrate(ctx: typer.Context) -> None:
    """Create or upgrade the database schema (workers also do this on start, once)."""
    with runtime(ctx, auto_migrate=False) as rt:
        applied = rt.store.migrate()
        out.print(f"applied: {', '.join(applied)}" if applied else "schema is up to date")


@cli.command()
def enqueue(
    ctx: typer.Context,
    agent: Annotated[str, typer.Argument(help="The registered agent to run.")],
    request: Annotated[
        str, typer.Option("--request", "-r", help="The request, a JSON object.")
    ] = "{}",
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="Idempotency key: enqueueing the same key again returns "
            "the existing run instead of a duplicate.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Put a run on the queue and print its id. Nothing is written if the agent is unknown
    or the request is not a valid JSON object."""
    try:
        body = json.loads(request)
    except json.JSONDecodeError as error:
        fail(f"--request is not valid JSON: {error}", 2)
    if not isinstance(body, dict):
        fail("--request must be a JSON object", 2)
    with runtime(ctx) as rt:
        run_id = rt.enqueue(agent, body, idempotency_key=key)
        if as_json:
            emit_json({"run_id": str(run_id)})
        else:
            out.print(str(run_id))


@cli.command()
def work(
    ctx: typer.Context,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Runs executed at once.")
    ] = 1,
    burst: Annotated[
        bool,
        typer.Option(
            "--burst",
            help="Exit once no run is ready and none is in flight "
            "(runs waiting on a retry delay are left for later).",
        ),
    ] = False,
    views: Annotated[
        bool,
        typer.Option(
            "--views/--no-views", help="Also keep the reporting views up to date meanwhile."
        ),
    ] = True,
) -> None:
    """Claim and execute queued runs until interrupted. The first Ctrl-C / SIGTERM stops
    claiming and lets runs in flight finish; a second one exits at once (the reaper then
    reclaims those runs when their leases expire)."""
    with runtime(ctx) as rt:
        worker = rt.worker(concurrency=concurrency, burst=burst)
        _stop_on_signals(worker.stop)
        stop_views = threading.Event()
        projector = threading.Thread(
            target=rt.projector().run_forever,
            args=(rt.settings.poll_interval, stop_views),
            name="steptrail-views",
            daemon=True,
        )
        if views:
            projector.start()
        try:
            report = worker.run()
        finally:
            stop_views.set()
            if views:
                projector.join(timeout=10)
        if views and burst:
            rt.project()
        out.print(json.dumps(report.as_dict()))


def _stop_on_signals(stop: Callable[[], None]) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    seen = {"count": 0}

    def handler(signum: int, frame: object) -> None:
        seen["count"] += 1
        if seen["count"] > 1:
            raise SystemExit(130)
        err.print("stopping: finishing runs in flight (signal again to exit now)")
        stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


@cli.command()
def show(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """A run's state and its full event trail, in order."""
    rid = parse_run_id(run_id)
    with runtime(ctx) as rt:
        row = rt.get(rid)
        events = rt.history(rid)
        if as_json:
            emit_json({"run": row_dict(row), "events": [event_dict(e) for e in events]})
        else:
            print_run(out, row, events)


ResumeOption = Annotated[
    str,
    typer.Option(
        "--resume",
        help="auto: a queued run goes back to the queue for a worker, an interactive one "
        "resumes here; here: resume in this process now; queue: hand it to a worker.",
    ),
]


def _resume_mode(value: str) -> Any:
    if value not in ("auto", "here", "queue"):
        raise typer.BadParameter("--resume is one of auto, here, queue")
    return value


def _decided(result: Any, as_json: bool) -> None:
    if as_json:
        emit_json(
            {
                "run_id": str(result.run_id),
                "outcome": result.outcome.value,
                "status": result.status.value,
            }
        )
    else:
        out.print(f"{result.run_id} {result.outcome.value} ({result.status.value})")


@cli.command()
def approve(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The waiting run's id.")],
    by: Annotated[str, typer.Option("--by", help="Who approves (recorded).")],
    digest: Annotated[
        str | None,
        typer.Option(
            "--digest",
            help="The digest of the pending calls you reviewed "
            "(`steptrail show` prints it); refused if the calls changed.",
        ),
    ] = None,
    resume: ResumeOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Approve the pending tool calls of a run waiting for approval, and resume it."""
    rid = parse_run_id(run_id)
    mode = _resume_mode(resume)
    with runtime(ctx) as rt:
        _decided(rt.approve(rid, by=by, digest=digest, resume=mode), as_json)


@cli.command()
def deny(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The waiting run's id.")],
    by: Annotated[str, typer.Option("--by", help="Who denies (recorded).")],
    digest: Annotated[
        str | None, typer.Option("--digest", help="The digest of the pending calls.")
    ] = None,
    resume: ResumeOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Deny the pending calls: each gets the error result "denied by the operator" and the
    agent carries on."""
    rid = parse_run_id(run_id)
    mode = _resume_mode(resume)
    with runtime(ctx) as rt:
        _decided(rt.deny(rid, by=by, digest=digest, resume=mode), as_json)


@cli.command("input")
def submit_input(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The waiting run's id.")],
    by: Annotated[str, typer.Option("--by", help="Who submits (recorded; values are not).")],
    values: Annotated[str, typer.Option("--values", help="The input, a JSON object.")],
    resume: ResumeOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Submit input to a run waiting for it; validated against its schema first."""
    rid = parse_run_id(run_id)
    mode = _resume_mode(resume)
    try:
        body = json.loads(values)
    except json.JSONDecodeError as error:
        fail(f"--values is not valid JSON: {error}", 2)
    if not isinstance(body, dict):
        fail("--values must be a JSON object", 2)
    with runtime(ctx) as rt:
        _decided(rt.submit_input(rid, body, by=by, resume=mode), as_json)


@cli.command()
def runs(
    ctx: typer.Context,
    status: Annotated[
        RunStatus | None, typer.Option("--status", help="Only runs in this status.")
    ] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's runs.")] = None,
    reason: Annotated[
        TerminationReason | None, typer.Option("--reason", help="Only runs ended so.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List runs, newest first. `--status waiting_for_approval` is the approvers' inbox:
    what each run waits for (tools, digest) and since when."""
    with runtime(ctx) as rt:
        rows = rt.runs(status=status, agent=agent, reason=reason, limit=limit)
        if as_json:
            emit_json([row_dict(r) for r in rows])
        else:
            out.print(runs_table(rows))


@cli.command()
def cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    by: Annotated[str, typer.Option("--by", help="Who cancels (recorded).")] = "operator",
) -> None:
    """Cancel a queued, running or waiting run (a worker running it stops at its next step)."""
    rid = parse_run_id(run_id)
    with runtime(ctx) as rt:
        row = rt.cancel(rid, by=by)
        out.print(f"{rid} {row.status.value}")


@cli.command()
def reap(
    ctx: typer.Context,
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="Stale runs handled per pass (N >= 1).")
    ] = 50,
    every: Annotated[
        float | None,
        typer.Option(
            "--every",
            min=0.1,
            metavar="SECONDS",
            help="Keep reaping every SECONDS (safe on several machines at once).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Reclaim or dead-letter running runs whose lease expired (by the database's clock)."""
    with runtime(ctx) as rt:
        reaper = rt.reaper()

        def report(result: Any) -> None:
            if as_json:
                emit_json(result.as_dict())
            else:
                out.print(result.summary())

        if every is None:
            report(reaper.reap_once(limit))
            return
        stop = threading.Event()
        _stop_on_signals(stop.set)
        reaper.reap_every(every, limit=limit, stop=stop, on_report=report)


@cli.command()
def verify(ctx: typer.Context) -> None:
    """Rebuild every view from the log into a scratch copy and report any difference from
    the live views (exit 1 on drift)."""
    with runtime(ctx) as rt:
        problems = rt.verify()
        for problem in problems:
            out.print(problem)
        out.print(f"{len(problems)} difference(s) between the live views and the log")
        if problems:
            raise typer.Exit(1)


@cli.command()
def rebuild(
    ctx: typer.Context,
    view: Annotated[
        str, typer.Argument(help="run-index, reporting (summaries, counts, dead letters) or all.")
    ] = "all",
) -> None:
    """Drop views and rebuild them from the event log, with a progress bar. Rebuilding the
    run index pauses writers for its duration."""

    def describe(name: str) -> str:
        return f"{name} ({'runs' if name == 'run-index' else 'events'})"

    with runtime(ctx) as rt, progress_bars(describe) as progress:
        try:
            done = rt.rebuild(view, progress=progress)
        except ValueError as error:
            fail(str(error), 2)
    for name, count in done.items():
        out.print(f"rebuilt {name}: {count} {'runs' if name == 'run-index' else 'events'}")


@cli.command()
def project(
    ctx: typer.Context,
    every: Annotated[
        float | None,
        typer.Option(
            "--every",
            min=0.05,
            metavar="SECONDS",
            help="Keep the views up to date, looking every SECONDS.",
        ),
    ] = None,
) -> None:
    """Bring the reporting views up to the log (workers also do this in the background)."""
    with runtime(ctx) as rt:
        if every is None:
            out.print(f"projected {rt.project()} event(s)")
            return
        stop = threading.Event()
        _stop_on_signals(stop.set)
        rt.projector().run_forever(every, stop)


@cli.command()
def stats(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Counts by agent and status, and by reason; the oldest queued run's age and the number
    of expired leases (from the live run index)."""
    with runtime(ctx) as rt:
        rt.project()
        views = rt.views
        counts, reasons, health = views.status_counts(), views.reason_counts(), views.health()
    oldest = (
        (health.now - health.oldest_queued_at).total_seconds()
        if health.oldest_queued_at is not None
        else None
    )
    if as_json:
        emit_json(
            {
                "by_status": [
                    {"agent": a, "status": s, "count": n} for (a, s), n in counts.items()
                ],
                "by_reason": [
                    {"status": s, "reason": r, "count": n} for (s, r), n in reasons.items()
                ],
                "oldest_queued_age_seconds": oldest,
                "stale_leases": health.stale_leases,
            }
        )
        return
    table = Table(title="Runs by agent and status")
    for column in ("agent", "status", "count"):
        table.add_column(column)
    for (agent, status), n in counts.items():
        table.add_row(agent, status, str(n))
    out.print(table)
    by_reason = Table(title="Ended runs by reason")
    for column in ("status", "reason", "count"):
        by_reason.add_column(column)
    for (status, reason), n in reasons.items():
        by_reason.add_row(status, reason, str(n))
    out.print(by_reason)
    out.print(f"oldest queued run: {f'{oldest:.1f} s' if oldest is not None else 'none queued'}")
    out.print(f"expired leases (stale runs awaiting the reaper): {health.stale_leases}")


@cli.command("dead-letters")
def dead_letters(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's runs.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Dead-lettered runs, newest first: reason, failure class, requeues, when."""
    with runtime(ctx) as rt:
        rt.project()
        rows = rt.views.dead_letters(limit=limit, agent=agent)
    if as_json:
        emit_json(
            [
                {
                    **vars(r),
                    "run_id": str(r.run_id),
                    "dead_lettered_at": r.dead_lettered_at.isoformat(),
                }
                for r in rows
            ]
        )
        return
    table = Table(title="Dead letters")
    for column in ("run", "agent", "reason", "cause", "failure", "requeues", "when"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(
            str(r.run_id),
            r.agent,
            r.reason,
            r.cause,
            f"{r.failure_class or '-'} ({r.error_type or '-'})",
            str(r.requeue_count),
            r.dead_lettered_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    out.print(table)


@cli.command()
def audit(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    at: Annotated[int, typer.Option("--at", min=1, help="The version to look at.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """A run's state as of any version, replayed from its log, and the events up to it."""
    rid = parse_run_id(run_id)
    with runtime(ctx) as rt:
        try:
            state, events = rt.audit(rid, at)
        except ValueError as error:
            fail(str(error), 2)
    if as_json:
        emit_json(
            {"state": state.model_dump(mode="json"), "events": [event_dict(e) for e in events]}
        )
        return
    table = Table(title=f"Run {rid} at version {at}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in state.model_dump(mode="json").items():
        table.add_row(key, str(value))
    out.print(table)
    out.print(trail_table(events))


@cli.command()
def purge(
    ctx: typer.Context,
    days: Annotated[
        int | None,
        typer.Option(
            "--days",
            min=1,
            help="Purge runs created more than N days ago, whatever "
            "their category (overrides every retention window).",
        ),
    ] = None,
    batch: Annotated[
        int, typer.Option("--batch", min=1, help="Runs removed per transaction.")
    ] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Remove runs past their retention window from every table (log, index, views, saved
    state), leaving a tombstone per run. Terminal runs follow the agent_run window, all other
    runs the approval window; both default to STEPTRAIL_RETENTION_DAYS (30). Safe to
    interrupt and run again."""
    with runtime(ctx) as rt, progress_bars(lambda category: f"purging {category}") as progress:
        report = rt.purge(days, batch=batch, progress=progress)
    if as_json:
        emit_json(report.as_dict())
    else:
        out.print(report.summary())


@cli.command()
def demo(
    ctx: typer.Context,
    runs: Annotated[int, typer.Option("--runs", min=1, max=200, help="Plain runs to add.")] = 6,
) -> None:
    """Try steptrail: queue scripted runs (retries, a dead-letter, a cancel, a worker that
    dies holding a run), work them with two workers and the reaper, and print the result."""
    from steptrail.demo import run_demo

    with runtime(
        ctx, lease_seconds=1.0, retry_base_seconds=0.2, poll_interval=0.05, log_level="error"
    ) as rt:
        run_demo(rt, out, plain_runs=runs)


def main() -> None:
    cli()
