"""Checks before a deploy: replay-check."""

from __future__ import annotations

from typing import Annotated

import typer

from steptrail.cli.app import cli, emit_json, out, runtime
from steptrail.domain.enums import RunStatus


@cli.command("replay-check")
def replay_check_command(
    ctx: typer.Context,
    status: Annotated[
        RunStatus | None,
        typer.Option(
            "--status",
            help="Only runs in this status (default: every in-flight status: waiting, "
            "queued, running).",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Check at most N runs.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Replay the journals of recorded in-flight runs against the agent code of `--app`,
    executing nothing (no step, tool or model call runs; nothing is written), and report
    every run the code would fail `non_deterministic`, with the position and both steps.
    Exit 1 if any run would fail. Settled runs keep no journal, so they are not checked."""
    from steptrail.testing.replay import replay_check

    with runtime(ctx) as rt:
        verdicts = replay_check(rt, status=status, limit=limit)
    failed = [v for v in verdicts if v.failed]
    if as_json:
        emit_json({"checked": len(verdicts), "failed": [v.as_dict() for v in failed]})
    else:
        for v in verdicts:
            if v.failed:
                where = f" at step {v.position}" if v.position is not None else ""
                out.print(
                    f"{v.run_id} {v.agent} ({v.status}): {v.verdict}{where}: {v.message}",
                    highlight=False,
                )
        skipped = sum(1 for v in verdicts if v.verdict == "skipped")
        out.print(
            f"checked {len(verdicts)} run(s): {len(failed)} would fail, {skipped} skipped "
            f"(no journal), {len(verdicts) - len(failed) - skipped} replay cleanly"
        )
    if failed:
        raise typer.Exit(1)
