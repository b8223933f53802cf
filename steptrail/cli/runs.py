"""Commands that queue, work and inspect runs: migrate, enqueue, work, show, runs, cancel,
retry, reap, demo."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO, TYPE_CHECKING, Annotated, Any, cast

import typer

from steptrail.cli.app import (
    check_enqueue,
    cli,
    emit_json,
    err,
    fail,
    json_object,
    out,
    parse_run_id,
    progress_bars,
    runtime,
    settings_for,
    stop_on_signals,
    unmigrated_runtime,
)
from steptrail.domain.enums import RunStatus, TerminationReason
from steptrail.domain.errors import InvalidActor
from steptrail.domain.limits import ENQUEUE_BATCH, MAX_DEPTH
from steptrail.render import (
    event_dict,
    family_dict,
    family_lines,
    print_run,
    row_dict,
    runs_table,
)

if TYPE_CHECKING:  # the runtime is imported by the commands that open it (ADR 0043)
    from steptrail.domain.ports import RecordedEvent
    from steptrail.runtime import Runtime
    from steptrail.worker_metrics import MetricsServer

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
    agent: Annotated[
        str | None,
        typer.Argument(
            help="The registered agent to run (with --from: the agent of lines that name none)."
        ),
    ] = None,
    request: Annotated[
        str | None,
        typer.Option(
            "--request",
            "-r",
            help="The request, a JSON object (default {}); or @FILE to read it from a file, or "
            "- to read it from standard input (at most STEPTRAIL_MAX_REQUEST_BYTES, default "
            "1 MiB).",
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="Idempotency key: enqueueing the same key again returns "
            "the existing run instead of a duplicate.",
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="FILE",
            help="Enqueue many runs from a JSON Lines file (- for standard input): one object "
            'per line, {"agent": …, "request": {…}, "idempotency_key": …, "queue": …, '
            '"priority": …, "concurrency_key": …}. Every line is '
            "checked before anything is written; prints each line's run id, in order.",
        ),
    ] = None,
    batch: Annotated[
        int,
        typer.Option("--batch", min=1, max=10_000, help="With --from: runs written per statement."),
    ] = ENQUEUE_BATCH,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue",
            "-q",
            help="The queue to put the run on (default: the agent's, else 'default'): one the "
            "App knows ('default', an agent's queue, or one declared with App.queue).",
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            "-p",
            help="Its claim priority, -100 to 100, higher first (default: the agent's, else 0).",
        ),
    ] = None,
    concurrency_key: Annotated[
        str | None,
        typer.Option(
            "--concurrency-key",
            "-k",
            help="Its concurrency key, e.g. tenant:acme (default: the agent's, else none): at "
            "most the key's limit (App.limit, else the agent's concurrency_limit) of its "
            "runs run at once.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Put a run on the queue and print its id (or many, with --from). Nothing is written if
    the agent is unknown, the request is not a valid JSON object, or the queue, priority or
    concurrency key is refused (with --from: if any line is bad; the error names the line)."""
    if source is not None:
        given = (request, key, queue, priority, concurrency_key)
        if any(v is not None for v in given):
            fail(
                "--from reads each run's request, key, queue, priority and concurrency key "
                "from its line; drop --request/--key/--queue/--priority/--concurrency-key",
                2,
            )
        _enqueue_from(ctx, source, agent, batch=batch, as_json=as_json)
        return
    if agent is None:
        fail("name the agent to run (or give --from FILE)", 2)
    max_bytes = settings_for(ctx).max_request_bytes
    body = json_object("{}" if request is None else request, "--request", max_bytes=max_bytes)
    check_enqueue(
        ctx, agent, body, key, queue=queue, priority=priority, concurrency_key=concurrency_key
    )
    with runtime(ctx, creates=True) as rt:
        run_id = rt.enqueue(
            agent,
            body,
            idempotency_key=key,
            queue=queue,
            priority=priority,
            concurrency_key=concurrency_key,
        )
        if as_json:
            emit_json({"run_id": str(run_id)})
        else:
            out.print(str(run_id))


def _enqueue_from(
    ctx: typer.Context, source: str, agent: str | None, *, batch: int, as_json: bool
) -> None:
    """`enqueue --from`: check every line (pass one), then write them `batch` at a time
    (pass two, reading the file again; standard input is spooled to a temporary file first),
    so a bad line anywhere writes nothing and memory stays flat whatever the file's size."""
    from steptrail.runtime import InvalidRequest
    from steptrail.workers.registry import UnknownAgent

    max_line = 2 * settings_for(ctx).max_request_bytes + 4096
    with _lines_source(source) as handle, runtime(ctx, creates=True) as rt:
        total = 0
        for number, item in _jsonl_items(handle, source, max_line, agent):
            try:
                rt.check_enqueue(item)
            except (InvalidRequest, UnknownAgent, InvalidActor) as error:
                fail(f"{source} line {number}: {error}; nothing was written", 2)
            total += 1
        handle.seek(0)
        written = 0
        with progress_bars(lambda _: f"enqueueing from {source}") as advance:
            chunk: list[tuple[int, dict[str, Any]]] = []
            for entry in _jsonl_items(handle, source, max_line, agent):
                chunk.append(entry)
                if len(chunk) >= batch:
                    written += _write_chunk(rt, chunk, source, written, as_json)
                    advance("enqueue", written, total)
                    chunk = []
            if chunk:
                written += _write_chunk(rt, chunk, source, written, as_json)
                advance("enqueue", written, total)
    err.print(f"{written:,} line(s) from {source} enqueued (a taken key returns its run)")


def _write_chunk(
    rt: Runtime, chunk: list[tuple[int, dict[str, Any]]], source: str, written: int, as_json: bool
) -> int:
    from steptrail.runtime import InvalidItem

    try:
        ids = rt.enqueue_many([item for _, item in chunk], batch=len(chunk))
    except InvalidItem as error:  # the file changed between the two passes
        fail(
            f"{source} line {chunk[error.index][0]}: {error.reason} (the file changed while "
            f"it was read; the {written:,} line(s) before this batch were enqueued)",
            2,
        )
    lines = (
        json.dumps({"line": number, "run_id": str(run_id)}) if as_json else str(run_id)
        for (number, _), run_id in zip(chunk, ids, strict=True)
    )
    sys.stdout.write("".join(f"{line}\n" for line in lines))  # plain: thousands of lines
    sys.stdout.flush()
    return len(chunk)


@contextmanager
def _lines_source(source: str) -> Iterator[IO[bytes]]:
    """The file to read lines from, seekable: the file itself, or standard input copied to
    a temporary file (kept in memory up to 8 MiB)."""
    if source == "-":
        with tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024) as spool:
            shutil.copyfileobj(sys.stdin.buffer, spool)
            spool.seek(0)
            yield cast(IO[bytes], spool)
        return
    try:
        handle = open(source, "rb")  # noqa: SIM115 - closed below, after both passes
    except OSError as error:
        fail(f"cannot read --from {source!r}: {error.strerror or error}", 2)
    with handle:
        yield handle


def _jsonl_items(
    handle: IO[bytes], source: str, max_line: int, agent: str | None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, item) for each non-blank line; a line that is not a JSON object (or is
    too long, not UTF-8, nested too deep, or names no agent) exits with code 2."""
    number = 0
    while True:
        raw = handle.readline(max_line + 1)
        if not raw:
            return
        number += 1
        if len(raw) > max_line:
            fail(
                f"{source} line {number} is longer than {max_line:,} bytes; nothing was written", 2
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            fail(f"{source} line {number} is not UTF-8 text; nothing was written", 2)
        if not text.strip():
            continue
        try:
            item = json.loads(text)
        except json.JSONDecodeError as error:
            fail(f"{source} line {number} is not valid JSON: {error}; nothing was written", 2)
        except RecursionError:
            fail(
                f"{source} line {number} nests more than {MAX_DEPTH} levels of objects and "
                "arrays; nothing was written",
                2,
            )
        if not isinstance(item, dict):
            fail(f"{source} line {number} must be a JSON object; nothing was written", 2)
        if "agent" not in item:
            if agent is None:
                fail(
                    f'{source} line {number} names no agent (give it an "agent" field, or '
                    "name a default agent: steptrail enqueue AGENT --from FILE)",
                    2,
                )
            item = {"agent": agent, **item}
        yield number, item


@cli.command()
def work(
    ctx: typer.Context,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            "-c",
            min=1,
            # Bounded like every option (ADR 0021), but high enough for async agents, whose
            # in-flight runs are tasks on one loop rather than threads (ADR 0023).
            max=10_000,
            help="Runs executed at once (at most 10,000): a thread each for sync agents, a "
            "task on the worker's one event loop for async agents.",
        ),
    ] = 1,
    burst: Annotated[
        bool,
        typer.Option(
            "--burst",
            help="Exit once no run is ready and none is in flight (runs waiting on a retry "
            "delay or a timer are left for later). Runs held back by their concurrency key's "
            "limit, or asleep on their rate limit and due within 60 s, are waited for.",
        ),
    ] = False,
    views: Annotated[
        bool,
        typer.Option(
            "--views/--no-views", help="Also keep the reporting views up to date meanwhile."
        ),
    ] = True,
    schedules: Annotated[
        bool,
        typer.Option(
            "--schedules/--no-schedules",
            help="Also run the scheduler: store the app's schedules and fire their due ticks "
            "(one run per tick however many workers do; ADR 0076).",
        ),
    ] = True,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            metavar="PORT",
            help="Serve this worker's Prometheus metrics (claim latency, step durations, "
            "queue wait, leases, outcomes, retries, in-flight runs, replays) at "
            "http://ADDR:PORT/metrics.",
        ),
    ] = None,
    metrics_addr: Annotated[
        str,
        typer.Option("--metrics-addr", metavar="ADDR", help="Address the metrics listen on."),
    ] = "0.0.0.0",  # noqa: S104 - Prometheus scrapes workers from other hosts
    queues: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            help="Claim only runs of this queue (repeat for several; default: every queue). "
            "A queue the App does not know is refused (exit 2) with the known ones listed.",
        ),
    ] = None,
) -> None:
    """Claim and execute queued runs until interrupted, the highest priority first. The first
    Ctrl-C / SIGTERM stops claiming and lets runs in flight finish; a second one exits at
    once (the reaper then reclaims those runs when their leases expire)."""
    with runtime(ctx, serving=True, creates=True) as rt:
        worker = rt.worker(concurrency=concurrency, burst=burst, queues=queues or None)
        server = _serve_worker_metrics(rt, metrics_port, metrics_addr)
        # The worker's metrics and tracer are made on their first use, which imports
        # prometheus_client and OpenTelemetry in the dispatcher (the main thread). Made here,
        # before the handlers are armed: a SIGTERM landing inside such an import broke
        # CPython's module lock (KeyError) and the worker exited 1 instead of finishing its
        # runs (seen once in CI).
        rt.prepare_observers()
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
        scheduler = threading.Thread(
            target=rt.scheduler().run_forever,
            args=(min(rt.settings.poll_interval, 1.0), stop_views),
            name="steptrail-schedules",
            daemon=True,
        )
        scheduling = schedules and bool(rt.app.schedules)
        if scheduling:
            scheduler.start()
        try:
            report = worker.run()
        finally:
            stop_views.set()
            if views:
                projector.join(timeout=10)
            if scheduling:
                scheduler.join(timeout=10)
            if server is not None:
                server.close()
        if views and burst:
            rt.project()
        out.print(json.dumps(report.as_dict()))


def _serve_worker_metrics(rt: Runtime, port: int | None, addr: str) -> MetricsServer | None:
    """Start the worker's metrics endpoint (with the process's CPU and memory), if asked."""
    if port is None or rt.metrics is None:
        return None
    from prometheus_client import ProcessCollector

    from steptrail.worker_metrics import serve_metrics

    ProcessCollector(registry=rt.metrics.registry)
    try:
        server = serve_metrics(rt.metrics.registry, port, addr)
    except OSError as error:
        fail(f"cannot serve metrics on {addr}:{port}: {error}", 2)
    err.print(f"worker metrics at http://{addr}:{server.port}/metrics")
    return server


TRAIL_PAGE = 100  # events `show` and `audit` draw unless told otherwise (ADR 0042)
MAX_VERSION = 2**31 - 1

FromOption = Annotated[
    int | None,
    typer.Option(
        "--from",
        min=1,
        max=MAX_VERSION,
        metavar="N",
        help="Show the trail from version N (default: its newest events).",
    ),
]
TrailLimitOption = Annotated[
    int | None,
    typer.Option(
        "--limit",
        min=1,
        max=MAX_LIMIT,
        metavar="K",
        help=f"Show at most K events of the trail (default {TRAIL_PAGE}).",
    ),
]
AllOption = Annotated[
    bool, typer.Option("--all", help="Show every event of the trail, however long.")
]


@dataclass(frozen=True)
class TrailPage:
    """Which versions of a trail of `last` events to show: `first`..`first + count - 1`,
    or all of them (`count` None). `paged` says whether the operator chose a page."""

    first: int
    count: int | None
    paged: bool

    def footer(self, shown: list[RecordedEvent], last: int) -> str | None:
        """The line that says what is shown and how to see the rest (None: all is shown)."""
        if not shown:
            return f"no events from version {self.first} (the trail has versions 1 to {last})"
        low, high = shown[0].version, shown[-1].version
        if low == 1 and high >= last:
            return None
        return (
            f"versions {low}-{high} of {last} shown; --from N --limit K for others, "
            "--all for every one"
        )


def trail_page(first: int | None, limit: int | None, every: bool, last: int) -> TrailPage:
    """The page of a trail of `last` events that `--from`, `--limit`, `--all` ask for: by
    default the newest `TRAIL_PAGE` events (where the run stands)."""
    if every:
        if first is not None or limit is not None:
            fail("--all shows every event; drop --from/--limit", 2)
        return TrailPage(1, None, paged=False)
    count = limit or TRAIL_PAGE
    start = first if first is not None else max(1, last - count + 1)
    return TrailPage(start, count, paged=first is not None or limit is not None)


@cli.command()
def show(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(help="The run's id, or 8+ hex digits of it (as `runs` shows).")
    ],
    first: FromOption = None,
    limit: TrailLimitOption = None,
    every: AllOption = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print JSON: the whole trail, unless --from/--limit choose a page (then the "
            "page, and where it stands under `page`).",
        ),
    ] = False,
) -> None:
    """A run's state and its event trail, in order: the newest 100 events, with a line
    saying how to see the others (`--from N --limit K`, `--all`)."""
    rid = parse_run_id(run_id)
    with runtime(ctx) as rt:
        rid = rt.resolve(rid)
        row = rt.get(rid)
        last = row.state.version
        page = trail_page(
            first, limit, every or (as_json and first is None and limit is None), last
        )
        events = rt.history(rid, first=page.first, limit=page.count)
        family = rt.family(rid)
        if as_json:
            body: dict[str, Any] = {"run": row_dict(row), "events": [event_dict(e) for e in events]}
            if page.paged:
                body["page"] = page_dict(page, events, last)
            if family.parent_id is not None or family.children:
                body["family"] = family_dict(family)
            emit_json(body)
            return
        print_run(out, row, events)
        for line in family_lines(family):
            out.print(line, highlight=False)
        footer = page.footer(events, last)
        if footer is not None:
            out.print(footer, highlight=False)


def page_dict(page: TrailPage, events: list[RecordedEvent], last: int) -> dict[str, Any]:
    """Where a page of `--json` output stands in its trail."""
    return {
        "from": events[0].version if events else page.first,
        "to": events[-1].version if events else None,
        "of": last,
    }


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
    before: Annotated[
        str | None,
        typer.Option(
            "--before",
            metavar="RUN_ID",
            help="The next page: runs created before this one (the last run of the previous page).",
        ),
    ] = None,
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", help="Only runs of this queue.")
    ] = None,
    min_priority: Annotated[
        int | None,
        typer.Option("--min-priority", help="Only runs of this priority or higher."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List runs, newest first, with their queue and priority. `--status
    waiting_for_approval` is the approvers' inbox: what each run waits for (tools, digest)
    and since when. Each page costs what it returns, however long the history (`--before`
    the last run shown for the next); `--queue` and `--min-priority` read the pages of the
    other filters until theirs is full."""
    key = parse_run_id(before) if before is not None else None
    with runtime(ctx) as rt:
        rows = rt.runs(
            status=status,
            agent=agent,
            reason=reason,
            limit=limit,
            before=key,
            queue=queue,
            min_priority=min_priority,
        )
        if as_json:
            emit_json([row_dict(r) for r in rows])
        else:
            out.print(runs_table(rows, width=out.width))


@cli.command()
def cancel(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(help="The run's id, or 8+ hex digits of it (as `runs` shows).")
    ],
    by: Annotated[str, typer.Option("--by", help="Who cancels (recorded).")] = "operator",
    keep_children: Annotated[
        bool,
        typer.Option("--keep-children", help="Leave the run's unfinished child runs running."),
    ] = False,
) -> None:
    """Cancel a queued, running or waiting run (a worker running it stops at its next step),
    and its unfinished child runs with it, recursively (unless --keep-children)."""
    rid = parse_run_id(run_id)
    with runtime(ctx) as rt:
        rid = rt.resolve(rid)
        row = rt.cancel(rid, by=by, keep_children=keep_children)
        out.print(f"{rid} {row.status.value}")


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """An instant given as an ISO 8601 time (UTC if no zone) or as an age: 90s, 30m, 12h, 7d."""
    now = now or datetime.now(UTC)
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = value.strip().lower()
    if text[-1:] in units and text[:-1].isdigit():
        return now - timedelta(seconds=int(text[:-1]) * units[text[-1]])
    try:
        at = datetime.fromisoformat(value.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is neither an ISO time nor an age like 30m, 12h, 7d"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


@cli.command()
def retry(
    ctx: typer.Context,
    run_id: Annotated[
        str | None,
        typer.Argument(
            help="The failed run's id or 8+ hex digits of it (or use --agent/--reason/--since)."
        ),
    ] = None,
    by: Annotated[str, typer.Option("--by", help="Who retries (recorded).")] = "",
    reset_budget: Annotated[
        bool,
        typer.Option("--reset-budget", help="Give the run its full requeue budget again."),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Retry even though a non-idempotent write's outcome is unknown, or a "
            "recorded one would run again (--from); recorded.",
        ),
    ] = False,
    from_position: Annotated[
        int | None,
        typer.Option(
            "--from",
            metavar="N",
            min=1,
            help="Run again from step N: steps before N replay from the journal, N and "
            "later run again (default: resume at the step that failed).",
        ),
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Bulk: failed runs of this agent.")
    ] = None,
    reason: Annotated[
        TerminationReason | None, typer.Option("--reason", help="Bulk: failed for this reason.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", metavar="TIME", help="Bulk: failed since TIME (ISO time, or 30m, 12h, 7d)."
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Bulk: at most this many.")] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Put a failed run back on the queue (dead-lettered or not), recorded with --by. It
    resumes: the steps it recorded replay from its journal (writes are not repeated, model
    calls not paid again) and it runs on from the step that failed; --from N runs steps N
    and later again. Refused for a run that is not failed, for one whose non-idempotent
    write's outcome is unknown, and for --from N before a recorded non-idempotent write,
    unless --force. With --agent/--reason/--since instead of RUN_ID: every matching failed
    run, resumed (a refused one is reported and skipped; exit 1 if any was refused)."""
    bulk = agent is not None or reason is not None or since is not None
    if (run_id is None) == (not bulk):
        raise typer.BadParameter("give a RUN_ID, or --agent/--reason/--since (not both)")
    if bulk and from_position is not None:
        raise typer.BadParameter("--from takes one RUN_ID, not --agent/--reason/--since")
    if run_id is not None:
        rid = parse_run_id(run_id)
        with runtime(ctx) as rt:
            rid = rt.resolve(rid)
            row = rt.retry(
                rid, by=by, reset_budget=reset_budget, force=force, from_position=from_position
            )
            last = rt.history(rid, first=row.state.version)[0].event
        from steptrail.domain.run import Run  # the pydantic models, only when needed

        if as_json:
            emit_json(row_dict(row))
        else:
            how = ""
            if isinstance(last, Run.Retried):
                how = f"{last.mode.value} at step {last.position}, "
            out.print(f"{rid} {row.status.value} ({how}requeues so far: {row.state.requeue_count})")
        return
    start = parse_since(since) if since is not None else datetime.fromtimestamp(0, UTC)
    with runtime(ctx) as rt:
        report = rt.retry_many(
            by=by,
            since=start,
            agent=agent,
            reason=reason,
            reset_budget=reset_budget,
            force=force,
            limit=limit,
        )
    if as_json:
        emit_json(
            {
                "retried": [str(r) for r in report.retried],
                "refused": [{"run_id": str(r), "error": e} for r, e in report.refused],
            }
        )
    else:
        for refused, why in report.refused:
            err.print(f"refused {refused}: {why}", highlight=False)
        out.print(f"retried {len(report.retried)} run(s), refused {len(report.refused)}")
    if report.refused:
        raise typer.Exit(1)


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
    with runtime(ctx, creates=True) as rt:
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
        ctx,
        serving=True,  # two workers and the reaper at once
        creates=True,
        lease_seconds=1.0,
        retry_base_seconds=0.2,
        poll_interval=0.05,
        log_level="error",
    ) as rt:
        run_demo(rt, out, plain_runs=runs)
