"""Commands for outside events: signal (ADR 0073)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from steptrail.cli.app import _read_source, cli, emit_json, fail, out, parse_run_id, runtime


@cli.command()
def signal(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(help="The run's id, or 8+ hex digits of it (as `runs` shows).")
    ],
    name: Annotated[str, typer.Argument(help="The signal's name, as the agent waits for it.")],
    payload: Annotated[
        str,
        typer.Option(
            "--payload",
            "-p",
            help="The payload: any JSON value, or @FILE, or - for standard input.",
        ),
    ] = "null",
    by: Annotated[str, typer.Option("--by", help="Who sends it (recorded).")] = "operator",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Deliver a signal to a run: a run waiting in `ctx.wait_event(NAME)` is queued at once;
    otherwise the signal is kept, in order, for the run's next wait for NAME. A signal to a
    settled run is refused (exit 2) and nothing is written."""
    from steptrail.domain.errors import IllegalTransition

    rid = parse_run_id(run_id)
    with runtime(ctx) as rt:
        rid = rt.resolve(rid)
        value = _payload(payload, rt.settings.max_payload_bytes)
        try:
            sent = rt.signal(rid, name, value, by=by)
        except IllegalTransition as error:
            fail(str(error), 2)
        except ValueError as error:
            fail(str(error), 2)
    if as_json:
        emit_json({"run_id": str(rid), "name": name, "seq": sent.seq, "woke": sent.woke})
    else:
        woke = "woke the run" if sent.woke else "kept for the run's next wait"
        out.print(f"{rid} signal {name!r} #{sent.seq} delivered ({woke})")


def _payload(value: str, max_bytes: int) -> Any:
    if value == "-" or value.startswith("@"):
        value = _read_source(value, "--payload", max_bytes)
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError) as error:
        fail(f"--payload is not valid JSON: {error}", 2)
