"""Commands for queues and priorities: priority (ADR 0077)."""

from __future__ import annotations

from typing import Annotated

import typer

from steptrail.cli.app import cli, emit_json, out, parse_run_id, runtime


# A negative priority is an argument, not an unknown option: `priority RUN -5`.
@cli.command(context_settings={"ignore_unknown_options": True})
def priority(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    value: Annotated[
        int,
        typer.Argument(
            metavar="PRIORITY", help="Its new claim priority, -100 to 100 (higher first)."
        ),
    ],
    by: Annotated[str, typer.Option("--by", help="Who changes it (recorded).")] = "operator",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Change the claim priority of a queued or waiting run: the claim takes it by the new
    priority from now on, and `show` lists the change in the trail. A priority out of range
    is refused (exit 2), as is a running or settled run (exit 1); nothing is written. The
    priority it has already writes nothing."""
    rid = parse_run_id(run_id)
    with runtime(ctx) as rt:
        row = rt.set_priority(rid, value, by=by)
    if as_json:
        emit_json(
            {
                "run_id": str(rid),
                "queue": row.state.queue,
                "priority": row.state.priority,
                "status": row.status.value,
            }
        )
    else:
        out.print(f"{rid} priority {row.state.priority} (queue {row.state.queue})")
