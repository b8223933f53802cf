"""Commands for people in the loop: approve, deny, input."""

from __future__ import annotations

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
)

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
    run_id: Annotated[
        str, typer.Argument(help="The waiting run's id, or 8+ hex digits of it (as `runs` shows).")
    ],
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
        rid = rt.resolve(rid)
        _decided(rt.approve(rid, by=by, digest=digest, resume=mode), as_json)


@cli.command()
def deny(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(help="The waiting run's id, or 8+ hex digits of it (as `runs` shows).")
    ],
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
        rid = rt.resolve(rid)
        _decided(rt.deny(rid, by=by, digest=digest, resume=mode), as_json)


@cli.command("input")
def submit_input(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(help="The waiting run's id, or 8+ hex digits of it (as `runs` shows).")
    ],
    by: Annotated[str, typer.Option("--by", help="Who submits (recorded; values are not).")],
    values: Annotated[
        str,
        typer.Option(
            "--values", help="The input, a JSON object (or @FILE, or - for standard input)."
        ),
    ],
    resume: ResumeOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Submit input to a run waiting for it; validated against its schema first."""
    rid = parse_run_id(run_id)
    mode = _resume_mode(resume)
    body = json_object(values, "--values", max_bytes=settings_for(ctx).max_payload_bytes)
    with runtime(ctx) as rt:
        rid = rt.resolve(rid)
        _decided(rt.submit_input(rid, body, by=by, resume=mode), as_json)
