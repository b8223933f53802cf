"""Commands over the views and the log's upkeep: stats, dead-letters, audit, project,
rebuild, verify, purge, metrics."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from steptrail.cli.app import (
    cli,
    emit_json,
    err,
    fail,
    out,
    parse_run_id,
    progress_bars,
    runtime,
    stop_on_signals,
)
from steptrail.cli.runs import (
    MAX_EVERY_S,
    MAX_LIMIT,
    AllOption,
    FromOption,
    TrailLimitOption,
    page_dict,
    trail_page,
)
from steptrail.domain.errors import StoreUnavailable
from steptrail.domain.limits import MAX_DAYS
from steptrail.render import add_row, event_dict, inert, trail_table

if TYPE_CHECKING:  # imported by the commands that use them (ADR 0043)
    from steptrail.infrastructure.projection_store import TrackedStatus
    from steptrail.runtime import Runtime


def refresh_views(rt: Runtime) -> None:
    """Bring the views up to the log, unless the database is read-only (then they are shown
    as last projected, and stderr says so)."""
    from steptrail.infrastructure.factory import ReadOnlyStore

    try:
        rt.project()
    except ReadOnlyStore:
        err.print("note: the database is read-only; views are shown as last brought up to date")


@cli.command()
def stats(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Counts by agent and status, and by reason; the oldest queued run's age and the number
    of expired leases (from the live run index)."""
    from steptrail.infrastructure.feed import format_position

    with runtime(ctx) as rt:
        try:
            refresh_views(rt)
        except StoreUnavailable:
            raise
        except Exception as error:  # noqa: BLE001 - a poison batch: show the rest, and say so
            rt.projector().failed(error, 1)
        views = rt.views
        counts, reasons, health = views.status_counts(), views.reason_counts(), views.health()
        runner = views.runner()
        tracked = rt.tracked()
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
                "views": {
                    "position": list(runner.position),
                    "failed_batches": runner.failures,
                    "last_error": runner.last_error,
                },
                "projections": [tracked_dict(t) for t in tracked],
            }
        )
        return
    table = Table(title="Runs by agent and status")
    for column in ("agent", "status", "count"):
        table.add_column(column)
    for (agent, status), n in counts.items():
        add_row(table, agent, status, n)
    out.print(table)
    by_reason = Table(title="Ended runs by reason")
    for column in ("status", "reason", "count"):
        by_reason.add_column(column)
    for (status, reason), n in reasons.items():
        add_row(by_reason, status, reason, n)
    out.print(by_reason)
    out.print(f"oldest queued run: {f'{oldest:.1f} s' if oldest is not None else 'none queued'}")
    out.print(f"expired leases (stale runs awaiting the reaper): {health.stale_leases}")
    if runner.failures:
        out.print(
            f"[red]views stuck[/red]: {runner.failures} batch(es) failed in a row at position "
            f"{runner.position}; last error: {escape(runner.last_error or '')}",
            markup=True,
            highlight=False,
        )
    projections = Table(title="Projections")
    for column in ("projection", "position", "lag (events)", "state"):
        projections.add_column(column, overflow="fold")
    for t in tracked:
        state = "ok"
        if t.failure is not None:
            state = (
                f"stopped at {format_position(t.failure.position)} "
                f"({t.failure.topic}, run {t.failure.run_id}, {t.failure.attempts} attempt(s)): "
                f"{t.failure.error}"
            )
        add_row(projections, t.name, format_position(t.position), t.lag, state)
    out.print(projections)


def tracked_dict(t: TrackedStatus) -> dict[str, Any]:
    """A tracked projection's status as JSON-compatible data."""
    from steptrail.infrastructure.feed import format_position

    failure = None
    if t.failure is not None:
        failure = {
            "position": format_position(t.failure.position),
            "run_id": str(t.failure.run_id) if t.failure.run_id else None,
            "topic": t.failure.topic,
            "error": t.failure.error,
            "failed_at": t.failure.failed_at.isoformat() if t.failure.failed_at else None,
            "attempts": t.failure.attempts,
        }
    return {
        "name": t.name,
        "position": format_position(t.position),
        "lag": t.lag,
        "failure": failure,
    }


@cli.command("dead-letters")
def dead_letters(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's runs.")] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=MAX_LIMIT, help="At most this many.")
    ] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Dead-lettered runs, newest first: reason, failure class, requeues, when."""
    with runtime(ctx) as rt:
        refresh_views(rt)
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
        add_row(
            table,
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
    run_id: Annotated[
        str, typer.Argument(help="The run's id, or 8+ hex digits of it (as `runs` shows).")
    ],
    at: Annotated[int, typer.Option("--at", min=1, max=2**31 - 1, help="The version to look at.")],
    first: FromOption = None,
    limit: TrailLimitOption = None,
    every: AllOption = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print JSON: every event up to --at, unless --from/--limit choose a page.",
        ),
    ] = False,
) -> None:
    """A run's state as of any version, replayed from its log, and the events up to it: the
    newest 100 of them, with a line saying how to see the others (`--from N --limit K`,
    `--all`)."""
    rid = parse_run_id(run_id)
    with runtime(ctx) as rt:
        rid = rt.resolve(rid)
        try:
            state, upto = rt.audit(rid, at)
        except ValueError as error:
            fail(str(error), 2)
    page = trail_page(first, limit, every or (as_json and first is None and limit is None), at)
    stop = at if page.count is None else min(at, page.first + page.count - 1)
    events = upto[page.first - 1 : stop]
    if as_json:
        body: dict[str, Any] = {
            "state": state.model_dump(mode="json"),
            "events": [event_dict(e) for e in events],
        }
        if page.paged:
            body["page"] = page_dict(page, events, at)
        emit_json(body)
        return
    table = Table(title=f"Run {rid} at version {at}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in state.model_dump(mode="json").items():
        add_row(table, key, value)
    out.print(table)
    out.print(trail_table(events))
    footer = page.footer(events, at)
    if footer is not None:
        out.print(footer, highlight=False)


@cli.command()
def project(
    ctx: typer.Context,
    every: Annotated[
        float | None,
        typer.Option(
            "--every",
            min=0.05,
            max=MAX_EVERY_S,
            metavar="SECONDS",
            help="Keep the views up to date, looking every SECONDS.",
        ),
    ] = None,
) -> None:
    """Bring the reporting views and the app's projections up to the log (workers also do
    this in the background). A projection that raises stops alone; see `stats`."""
    from steptrail.projections.custom import ProjectionFailed

    with runtime(ctx, creates=True) as rt:
        if every is None:
            failed = False
            for name, done in rt.project_all().items():
                if isinstance(done, ProjectionFailed):
                    failed = True
                    err.print(f"[bold red]{name}:[/] {done}", highlight=False)
                else:
                    out.print(f"{name}: projected {done} event(s)")
            if failed:
                raise typer.Exit(1)
            return
        stop = threading.Event()
        stop_on_signals(stop.set)
        rt.projector().run_forever(every, stop)


@cli.command()
def rebuild(
    ctx: typer.Context,
    view: Annotated[
        str,
        typer.Argument(
            help="run-index, reporting (summaries, counts, dead letters), the name of one of "
            "the app's projections, or all."
        ),
    ] = "all",
) -> None:
    """Drop views and rebuild them from the event log, with a progress bar. Rebuilding the
    run index pauses writers for its duration; a projection's tables are dropped, created
    again and refolded in batches."""
    from steptrail.projections.custom import ProjectionFailed

    def describe(name: str) -> str:
        return f"{name} ({'runs' if name == 'run-index' else 'events'})"

    with runtime(ctx) as rt, progress_bars(describe) as progress:
        try:
            done = rt.rebuild(view, progress=progress)
        except ValueError as error:
            fail(str(error), 2)
        except ProjectionFailed as error:
            fail(str(error), 1)
    for name, count in done.items():
        out.print(f"rebuilt {name}: {count} {'runs' if name == 'run-index' else 'events'}")


@cli.command()
def verify(
    ctx: typer.Context,
    view: Annotated[
        str | None,
        typer.Argument(
            help="run-index, reporting, or the name of one of the app's projections "
            "(default: every view)."
        ),
    ] = None,
) -> None:
    """Rebuild views from the log into a scratch copy and report any difference from the
    live ones (exit 1 on drift). A projection is refolded into a private copy of its tables
    (in memory on SQLite, a scratch schema on PostgreSQL) up to its live position."""
    from steptrail.projections.custom import ProjectionFailed

    with runtime(ctx) as rt:
        try:
            problems = rt.verify(view)
        except ValueError as error:
            fail(str(error), 2)
        except ProjectionFailed as error:
            fail(f"cannot rebuild into a scratch copy: {error}", 1)
        for problem in problems:
            out.print(inert(problem))
        out.print(f"{len(problems)} difference(s) between the live views and the log")
        if problems:
            raise typer.Exit(1)


@cli.command()
def purge(
    ctx: typer.Context,
    days: Annotated[
        int | None,
        typer.Option(
            "--days",
            min=1,
            max=MAX_DAYS,
            help="Purge runs created more than N days ago, whatever "
            "their category (overrides every retention window).",
        ),
    ] = None,
    batch: Annotated[
        int, typer.Option("--batch", min=1, max=MAX_LIMIT, help="Runs removed per transaction.")
    ] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Remove runs past their retention window from every table (log, index, views, saved
    state), leaving a tombstone per run. Terminal runs follow the agent_run window, all other
    runs the approval window; both default to STEPTRAIL_RETENTION_DAYS (30). Safe to
    interrupt and run again."""
    with (
        runtime(ctx, creates=True) as rt,
        progress_bars(lambda category: f"purging {category}") as progress,
    ):
        report = rt.purge(days, batch=batch, progress=progress)
    if as_json:
        emit_json(report.as_dict())
    else:
        out.print(report.summary())


@cli.command()
def metrics(
    ctx: typer.Context,
    serve: Annotated[
        int | None,
        typer.Option(
            "--serve",
            metavar="PORT",
            min=1,
            max=65535,
            help="Serve the metrics over HTTP on this port (for Prometheus to scrape) "
            "instead of printing them once.",
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
) -> None:
    """Prometheus metrics read from the views: runs by agent and status, ended runs by
    reason, the oldest queued run's age, expired leases. Printed once, the views are brought
    up to date first; served, a scrape only reads them (workers keep them current)."""
    from prometheus_client import generate_latest

    from steptrail.metrics import registry_for
    from steptrail.metrics import serve as serve_metrics

    with runtime(ctx, serving=serve is not None) as rt:
        if serve is None:
            refresh_views(rt)
            out.file.write(generate_latest(registry_for(rt)).decode("utf-8"))
            return
        try:
            server, thread = serve_metrics(rt, host, serve)
        except OSError as error:
            fail(f"cannot serve metrics on {host}:{serve}: {error.strerror or error}", 2)
        err.print(f"serving metrics on http://{inert(host)}:{serve}/metrics (Ctrl-C to stop)")
        stop = threading.Event()
        stop_on_signals(stop.set)
        stop.wait()
        server.shutdown()
        thread.join(timeout=5)


@cli.command()
def console(
    ctx: typer.Context,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to listen on. Anything but loopback needs STEPTRAIL_CONSOLE_TOKEN, "
            "and every request must then carry it.",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port.")] = 8765,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Hide and refuse every action.")
    ] = False,
    operator: Annotated[
        str | None,
        typer.Option(
            "--operator",
            help="Name actions are recorded under until a person sets theirs on the page "
            "(default: console:<your login>).",
        ),
    ] = None,
    poll: Annotated[
        float, typer.Option("--poll", min=1.0, metavar="SECONDS", help="Live refresh period.")
    ] = 5.0,
) -> None:
    """Serve the operator console: runs, a run's trail, the inbox, dead letters and an
    overview, read from the reporting views and the log; actions (cancel, retry, approve,
    deny, input) go through the same use cases as these commands, recorded with the
    operator's name. Needs `pip install 'steptrail[console]'`."""
    import getpass
    import os

    try:
        from steptrail.console import TOKEN_ENV, ConsoleConfig, ConsoleRefused, check_bind, serve
    except ImportError as error:
        fail(f"the console needs its extra: pip install 'steptrail[console]' ({error})", 2)
    token = os.environ.get(TOKEN_ENV) or None
    try:
        check_bind(host, token)
    except ConsoleRefused as error:
        fail(str(error), 2)
    config = ConsoleConfig(
        host=host,
        port=port,
        read_only=read_only,
        token=token,
        operator=operator or f"console:{getpass.getuser()}",
        poll_seconds=poll,
    )
    with runtime(ctx, serving=True, creates=not read_only) as rt:
        where = f"http://{host if ':' not in host else f'[{host}]'}:{port}/"
        err.print(
            f"steptrail console on {where}"
            + (" (send the token: open it with ?token=…)" if token else "")
            + (" read-only" if read_only else ""),
            highlight=False,
        )
        serve(rt, config)
