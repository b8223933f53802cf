"""`steptrail schedules`: list, pause, resume and trigger the schedules (ADR 0076)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from steptrail.cli.app import cli, emit_json, fail, out, runtime

schedules = typer.Typer(
    help="The schedules the store keeps (defined in code with App.schedule; a worker stores "
    "them when it starts): list them, pause or resume one, or run one now.",
    no_args_is_help=False,
    invoke_without_command=True,
)
cli.add_typer(schedules, name="schedules")

BY = Annotated[str, typer.Option("--by", help="Who does it (recorded).")]
NAME = Annotated[str, typer.Argument(help="The schedule name `steptrail schedules` lists.")]


def _row_dict(row: Any) -> dict[str, Any]:
    s = row.schedule
    return {
        "name": s.name,
        "cron": s.cron,
        "agent": s.agent,
        "request": dict(s.request),
        "missed": s.missed.value,
        "grace_seconds": s.grace_s,
        "paused": row.paused,
        "next_tick_at": row.next_tick_at.isoformat(),
        "last_tick_at": row.last_tick_at.isoformat() if row.last_tick_at else None,
        "last_run_id": str(row.last_run_id) if row.last_run_id else None,
        "updated_by": row.updated_by,
    }


@schedules.callback()
def list_schedules(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the schedules: cron, agent, next tick, last run, paused or not."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    from steptrail.render import add_row

    with runtime(ctx) as rt:
        rows = rt.schedules()
    if as_json:
        emit_json([_row_dict(r) for r in rows])
        return
    table = Table(title="Schedules")
    for column in ("name", "cron", "agent", "state", "next tick", "last run", "missed"):
        table.add_column(column, overflow="fold")
    for row in rows:
        d = _row_dict(row)
        add_row(
            table,
            d["name"],
            d["cron"],
            d["agent"],
            "paused" if row.paused else "active",
            row.next_tick_at.strftime("%Y-%m-%d %H:%M:%S"),
            (d["last_run_id"] or "-")[-8:],
            d["missed"],
        )
    out.print(table)


def _unknown(error: Exception) -> None:
    fail(str(error), 1)


@schedules.command("pause")
def pause(ctx: typer.Context, name: NAME, by: BY) -> None:
    """Stop firing a schedule; ticks while it is paused are missed (its policy applies)."""
    from steptrail.domain.schedules import UnknownSchedule

    with runtime(ctx) as rt:
        try:
            rt.pause_schedule(name, by=by)
        except UnknownSchedule as error:
            _unknown(error)
    out.print(f"{name} paused")


@schedules.command("resume")
def resume(ctx: typer.Context, name: NAME, by: BY) -> None:
    """Fire a paused schedule again (ticks older than its grace follow its policy)."""
    from steptrail.domain.schedules import UnknownSchedule

    with runtime(ctx) as rt:
        try:
            rt.resume_schedule(name, by=by)
        except UnknownSchedule as error:
            _unknown(error)
    out.print(f"{name} resumed")


@schedules.command("trigger")
def trigger(
    ctx: typer.Context,
    name: NAME,
    by: BY,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Enqueue one run of a schedule now (outside its ticks) and print its id."""
    from steptrail.domain.schedules import UnknownSchedule

    with runtime(ctx) as rt:
        try:
            run_id = rt.trigger_schedule(name, by=by)
        except UnknownSchedule as error:
            _unknown(error)
    if as_json:
        emit_json({"run_id": str(run_id), "schedule": name})
    else:
        out.print(str(run_id))
