"""`steptrail limits`: the rate limits the store keeps and their window's use (ADR 0080)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from steptrail.cli.app import cli, emit_json, out, runtime


def _row_dict(row: Any) -> dict[str, Any]:
    limit = row.limit
    return {
        "name": limit.name,
        "requests": limit.requests,
        "tokens": limit.tokens,
        "per_seconds": limit.per_s,
        "margin_seconds": limit.margin_s,
        "used_requests": row.used_requests,
        "used_tokens": row.used_tokens,
        "blocked_until": row.blocked_until.isoformat() if row.blocked_until else None,
        "updated_by": row.updated_by,
    }


def _use(used: int, most: int | None) -> str:
    return "-" if most is None else f"{used}/{most}"


@cli.command("limits")
def list_limits(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the rate limits (defined in code with App.rate_limit; a worker stores them when
    it starts): requests and tokens used in the window now, and a provider's block."""
    from rich.table import Table

    from steptrail.render import add_row

    with runtime(ctx) as rt:
        rows = rt.rate_limits()
    if as_json:
        emit_json([_row_dict(r) for r in rows])
        return
    table = Table(title="Rate limits")
    for column in ("name", "per", "requests", "tokens", "blocked until"):
        table.add_column(column, overflow="fold")
    for row in rows:
        add_row(
            table,
            row.limit.name,
            f"{row.limit.per_s:g} s",
            _use(row.used_requests, row.limit.requests),
            _use(row.used_tokens, row.limit.tokens),
            row.blocked_until.strftime("%Y-%m-%d %H:%M:%S") if row.blocked_until else "-",
        )
    out.print(table)
