"""What every command shares: the Typer app, global options, opening the runtime, turning
known failures into exit codes, JSON output and progress bars.

Exit codes: 0 success; 1 the run is unknown or cannot do that now (e.g. cancel a finished
run); 2 bad input (unknown agent, malformed JSON, bad option, setting or URL), nothing
written; 3 the database cannot be reached or its schema is missing. Every error is one line,
`error: …`, on stderr (ADR 0021).
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
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar
from uuid import UUID

import typer
from rich.console import Console

from steptrail import _startup
from steptrail.domain.limits import MAX_DEPTH, depth
from steptrail.render import inert

# Everything else (the runtime, the stores and their drivers, settings, logging, progress
# bars) is imported inside the function that needs it, so that `steptrail --help` and a
# command's `--help` do not pay for it (ADR 0043; tests/unit/test_cli_imports.py).
if TYPE_CHECKING:
    from steptrail.infrastructure.settings import Settings
    from steptrail.runtime import Runtime
    from steptrail.workers.registry import App

cli = typer.Typer(
    name="steptrail",
    help=(
        "Durable, event-sourced runs for LLM agents. Every run is an append-only event log; "
        "workers claim runs under a lease renewed at every step; the reaper reclaims runs "
        "whose worker died. Configure with STEPTRAIL_* variables (see README)."
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
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
    err.print(f"[bold red]error:[/] {inert(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def load_app(ref: str) -> App:
    """The App at `module:attribute` (an App, or a callable returning one)."""
    from steptrail.workers.registry import App

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
def runtime(
    ctx: typer.Context, *, serving: bool = False, creates: bool = False, **overrides: Any
) -> Iterator[Runtime]:
    """Open the runtime the global options describe, turning known failures into exits.

    A command that ends once its work is done opens a one-shot runtime (one PostgreSQL
    connection, ADR 0056); one that `serving` runs until stopped (workers, the console, a
    metrics endpoint) gets the connection pool. Only a command that `creates` (work,
    enqueue, reap, purge, project, demo, a console that may act) creates or upgrades the
    schema when it is missing or behind; every other command says so and exits 3, with
    nothing created, not even a SQLite file (ADR 0074)."""
    from steptrail.domain.errors import (
        CorruptResumableState,
        DigestMismatch,
        IllegalTransition,
        InvalidActor,
        InvalidInput,
        InvalidRunId,
        StoreUnavailable,
        UnknownRun,
        UnreadableEvent,
        UnreadableRun,
    )
    from steptrail.domain.limits import PayloadRejected
    from steptrail.domain.schedules import InvalidSchedule, UnknownSchedule
    from steptrail.infrastructure.factory import ReadOnlyStore
    from steptrail.runtime import InvalidRequest
    from steptrail.workers.registry import UnknownAgent, UnknownQueue

    rt = _open(ctx, ensure_schema=True, one_shot=not serving, may_migrate=creates, **overrides)
    try:
        yield rt
    except UnknownAgent as error:
        fail(f"{error}{_agents_hint(ctx)}", 2)
    except (
        UnknownQueue,
        InvalidRequest,
        InvalidInput,
        InvalidActor,
        PayloadRejected,
        InvalidRunId,
        InvalidSchedule,
    ) as error:
        fail(str(error), 2)
    except (
        UnknownRun,
        IllegalTransition,
        DigestMismatch,
        CorruptResumableState,
        UnreadableEvent,
        UnreadableRun,
        ReadOnlyStore,
        UnknownSchedule,
    ) as error:
        fail(str(error), 1)
    except StoreUnavailable as error:
        fail(f"the database is not available: {error}", 3)
    finally:
        rt.close()


def _agents_hint(ctx: typer.Context) -> str:
    """Where the agents an unknown-agent error lists came from, and how to load others."""
    options: Options = ctx.obj
    if options.app_ref is None:
        return "; load your agents with --app MODULE:ATTR or STEPTRAIL_APP=MODULE:ATTR"
    return f"; the agents are those of --app/STEPTRAIL_APP {options.app_ref} and the built-in ones"


def check_enqueue(
    ctx: typer.Context,
    agent: str,
    body: dict[str, Any],
    key: str | None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    concurrency_key: str | None = None,
) -> None:
    """Refuse a bad enqueue (unknown agent, request its model rejects, blank key, a queue,
    priority or concurrency key the App refuses) before a database is opened: bad input
    creates nothing, not even the schema (ADR 0074, 0077, 0078)."""
    from steptrail.domain.errors import InvalidActor
    from steptrail.runtime import InvalidRequest, checked_enqueue, combined_app, placement
    from steptrail.workers.registry import UnknownAgent

    options: Options = ctx.obj
    app = combined_app(load_app(options.app_ref) if options.app_ref else None)
    try:
        checked_enqueue(app, settings_for(ctx), agent, body, key=key, actor="enqueue")
        placement(app, agent, queue, priority, concurrency_key)
    except UnknownAgent as error:
        fail(f"{error}{_agents_hint(ctx)}", 2)
    except (InvalidRequest, InvalidActor) as error:
        fail(str(error), 2)


def settings_for(ctx: typer.Context, **overrides: Any) -> Settings:
    """The settings the environment, the global options and `overrides` describe."""
    from steptrail.infrastructure.settings import Settings

    options: Options = ctx.obj
    if options.database_url is not None:
        overrides = {**overrides, "database_url": options.database_url}
    try:
        settings = Settings(**overrides)
    except ValueError as error:
        message = str(error).splitlines()[0]
        if options.database_url is not None and "DATABASE_URL" in message:
            message = "--database-url must not be empty (sqlite:///path.db or postgresql://…)"
        fail(message, 2)
    return settings


def _open(
    ctx: typer.Context,
    *,
    ensure_schema: bool,
    one_shot: bool,
    may_migrate: bool = True,
    **overrides: Any,
) -> Runtime:
    from steptrail.domain.errors import StoreUnavailable
    from steptrail.infrastructure.factory import SchemaMissing
    from steptrail.infrastructure.logging import configure_logging
    from steptrail.runtime import open_runtime

    options: Options = ctx.obj
    settings = settings_for(ctx, **overrides)
    configure_logging(settings.log_format, settings.log_level)
    try:
        app = load_app(options.app_ref) if options.app_ref else None
        rt = open_runtime(
            app,
            settings=settings,
            ensure_schema=ensure_schema,
            one_shot=one_shot,
            may_migrate=may_migrate,
        )
    except ValueError as error:
        fail(str(error).splitlines()[0], 2)
    except SchemaMissing as error:
        fail(str(error), 3)
    except StoreUnavailable as error:
        fail(f"the database is not available: {error}", 3)
    _startup.resume()  # the start is over: collect garbage again (ADR 0051)
    return rt


@contextmanager
def unmigrated_runtime(ctx: typer.Context) -> Iterator[Runtime]:
    """A runtime whose schema may be missing or behind (for `migrate` only)."""
    from steptrail.domain.errors import StoreUnavailable
    from steptrail.infrastructure.factory import ReadOnlyStore

    rt = _open(ctx, ensure_schema=False, one_shot=True)
    try:
        yield rt
    except ReadOnlyStore as error:
        fail(str(error), 1)
    except StoreUnavailable as error:
        fail(f"the database is not available: {error}", 3)
    finally:
        rt.close()


@contextmanager
def progress_bars(describe: Callable[[str], str]) -> Iterator[Callable[[str, int, int], None]]:
    """Progress bars on stderr, one per named task; yields `advance(name, done, total)`."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=err, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def advance(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(describe(name), total=total or None)
            bar.update(tasks[name], completed=done, total=max(total, done) or None)

        yield advance


def json_object(value: str, option: str, *, max_bytes: int | None = None) -> dict[str, Any]:
    """The JSON object an option holds, or a clear exit-2 error.

    With `max_bytes`, the option may also be `@FILE` (read the file) or `-` (read standard
    input), and no more than about twice `max_bytes` is read (white space may take room;
    the canonical form is checked against `max_bytes` itself later).
    """
    if max_bytes is not None and (value == "-" or value.startswith("@")):
        value = _read_source(value, option, max_bytes)
    try:
        body = json.loads(value)
    except json.JSONDecodeError as error:
        fail(f"{option} is not valid JSON: {error}", 2)
    except RecursionError:
        fail(f"{option} nests more than {MAX_DEPTH} levels of objects and arrays", 2)
    if not isinstance(body, dict):
        fail(f"{option} must be a JSON object", 2)
    if depth(body) > MAX_DEPTH:
        fail(f"{option} nests more than {MAX_DEPTH} levels of objects and arrays", 2)
    return body


def _read_source(value: str, option: str, max_bytes: int) -> str:
    allowed = 2 * max_bytes + 1024
    try:
        if value == "-":
            raw = sys.stdin.buffer.read(allowed + 1)
        else:
            with open(value[1:], "rb") as source:
                raw = source.read(allowed + 1)
    except OSError as error:
        fail(f"cannot read {option} from {value!r}: {error.strerror or error}", 2)
    if len(raw) > allowed:
        fail(
            f"{option} from {value!r} is larger than {allowed:,} bytes "
            f"(STEPTRAIL_MAX_REQUEST_BYTES is {max_bytes:,})",
            2,
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"{option} from {value!r} is not UTF-8 text", 2)


def parse_run_id(value: str) -> UUID | str:
    """A run id, or the hex digits of a part of one (`Runtime.resolve` finds its run);
    anything else is refused here, before a database is opened (ADR 0074)."""
    from steptrail.domain.errors import InvalidRunId
    from steptrail.domain.ids import run_reference

    try:
        return run_reference(value)
    except InvalidRunId as error:
        fail(str(error), 2)


def emit_json(data: Any) -> None:
    """Print `data` as indented JSON: highlighted on a terminal; written as is otherwise
    (the same text, without Rich laying out a long trail token by token)."""
    text = json.dumps(data, default=str)
    if out.is_terminal:
        out.print_json(text)
        return
    out.file.write(json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n")


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
            "(default: $STEPTRAIL_DATABASE_URL, else sqlite:///steptrail.db). Add "
            "?mode=ro to a SQLite URL to open it read-only.",
        ),
    ] = None,
) -> None:
    ctx.obj = Options(app_ref=app, database_url=database_url)


def stop_on_signals(stop: Callable[[], None], message: str = "stopping") -> None:
    """Call `stop` on the first SIGINT/SIGTERM; exit at once on the second."""
    if threading.current_thread() is not threading.main_thread():
        return
    seen = {"count": 0}

    def handler(signum: int, frame: object) -> None:
        seen["count"] += 1
        if seen["count"] > 1:
            raise SystemExit(130)
        err.print(f"{message} (signal again to exit now)")
        stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def run_cli() -> None:
    """Run the command line; usage errors become the same one-line `error: …` (exit 2) as
    every other refusal, instead of a usage box."""
    try:
        code = cli(standalone_mode=False)
    except typer.TyperException as error:
        # typer's (vendored click's) usage errors: bad option values, unknown options,
        # missing arguments. No arguments at all still shows the help.
        exit_code = int(getattr(error, "exit_code", 1))
        if type(error).__name__ == "NoArgsIsHelpError":
            error.show()  # type: ignore[attr-defined]
            sys.exit(exit_code)
        format_message = getattr(error, "format_message", None)
        message = format_message() if callable(format_message) else str(error)
        message += _usage_hint(message, sys.argv[1:])
        err.print(f"[bold red]error:[/] {inert(message)}", highlight=False, soft_wrap=True)
        sys.exit(exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_hint(message: str, argv: list[str]) -> str:
    """A pointer for the usage errors people make most (ADR 0074)."""
    if "unexpected extra argument" in message and "enqueue" in argv:
        return (
            '; the request is an option: steptrail enqueue AGENT -r \'{"key": "value"}\''
            " (or -r @request.json)"
        )
    return ""
