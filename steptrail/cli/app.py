"""What every command shares: the Typer app, global options, opening the runtime, turning
known failures into exit codes, JSON output and progress bars.

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
from steptrail.runtime import InvalidRequest, Runtime, open_runtime
from steptrail.workers.execute import CorruptResumableState
from steptrail.workers.registry import App, UnknownAgent

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


def json_object(value: str, option: str) -> dict[str, Any]:
    """The JSON object an option holds, or a clear exit-2 error."""
    try:
        body = json.loads(value)
    except json.JSONDecodeError as error:
        fail(f"{option} is not valid JSON: {error}", 2)
    if not isinstance(body, dict):
        fail(f"{option} must be a JSON object", 2)
    return body


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
