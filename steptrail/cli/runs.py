"""Commands that queue, work and inspect runs: migrate, enqueue, work, show, runs, cancel,
reap, demo."""

from __future__ import annotations

import json
import threading
from typing import Annotated, Any

import typer

from steptrail.cli.app import (
    cli,
    emit_json,
    json_object,
    out,
    parse_run_id,
    runtime,
    settings_for,
    stop_on_signals,
    unmigrated_runtime,
)
from steptrail.domain.enums import RunStatus, TerminationReason
from steptrail.render import event_dict, print_run, row_dict, runs_table

MAX_LIMIT = 10_000
MAX_EVERY_S = 86_400.0


@cli.command()
def migrate(ctx: typer.Context) -> None:
    """Create or upgrade the database schema (workers also do this on start, once, unless
    STEPTRAIL_AUTO_MIGRATE=false; this command works either way)."""
    with unmigrated_runtime(ctx) as rt:
        applied = rt.store.migrate()
        out.print(f"applied: {', '.join(applied)}" if applied else "schema is up to date")


@cli.command()
def enqueue(
    ctx: typer.Context,
    agent: Annotated[str, typer.Argument(help="The registered agent to run.")],
    request: Annotated[
        str,
        typer.Option(
            "--request",
            "-r",
            help="The request, a JSON object; or @FILE to read it from a file, or - to read "
            "it from standard input (at most STEPTRAIL_MAX_REQUEST_BYTES, default 1 MiB).",
        ),
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
    body = json_object(request, "--request", max_bytes=settings_for(ctx).max_request_bytes)
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
        int,
        typer.Option("--concurrency", "-c", min=1, max=256, help="Runs executed at once."),
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
        stop_on_signals(worker.stop, "stopping: finishing runs in flight")
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
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=MAX_LIMIT, help="At most this many.")
    ] = 50,
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
        int,
        typer.Option("--limit", min=1, max=MAX_LIMIT, help="Stale runs handled per pass (N >= 1)."),
    ] = 50,
    every: Annotated[
        float | None,
        typer.Option(
            "--every",
            min=0.1,
            max=MAX_EVERY_S,
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
        stop_on_signals(stop.set)
        reaper.reap_every(every, limit=limit, stop=stop, on_report=report)


@cli.command()
def demo(
    ctx: typer.Context,
    runs: Annotated[int, typer.Option("--runs", min=1, max=200, help="Plain runs to add.")] = 6,
) -> None:
    """Try steptrail: queue scripted runs (retries, a dead-letter, an approval, a cancel, a
    worker that dies holding a run), work them with two workers and the reaper, and print
    the result."""
    from steptrail.demo import run_demo

    with runtime(
        ctx, lease_seconds=1.0, retry_base_seconds=0.2, poll_interval=0.05, log_level="error"
    ) as rt:
        run_demo(rt, out, plain_runs=runs)
