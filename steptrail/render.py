"""How runs and trails look on a terminal and in `--json` output.

Every stored string is shown inert (ADR 0021): Rich markup in it is escaped and control
characters are shown as escapes (`\\x1b`), so nothing a request, an agent or a person's name
carries can restyle, hide or fake a line of output. `--json` output is JSON-escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.markup import render as render_markup
from rich.table import Table

from steptrail.domain.ids import short_id
from steptrail.domain.rate_limits import STEP_NAME_PREFIX as RATE_LIMIT_TIMER

if TYPE_CHECKING:  # only named in annotations: importing them costs the pydantic models
    from steptrail.domain.ports import RecordedEvent
    from steptrail.domain.run import Run
    from steptrail.projections.run_index import RunRow
    from steptrail.runtime_views import Family


def inert(value: object) -> str:
    """`value` as text that a terminal shows as is: control and other non-printable
    characters escaped, Rich markup escaped."""
    text = str(value)
    if not text.isprintable():
        text = "".join(
            c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
        )
    return escape(text)


def add_row(table: Table, *cells: object) -> None:
    """Add a row of inert cells (see `inert`)."""
    table.add_row(*(inert(c) for c in cells))


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def row_dict(row: RunRow) -> dict[str, Any]:
    """A run's state and instants as JSON-compatible data."""
    state = row.state.model_dump(mode="json")
    return {
        **state,
        "created_at": _iso(row.created_at),
        "updated_at": _iso(row.updated_at),
        "lease_expires_at": _iso(row.lease_expires_at),
        "available_at": _iso(row.available_at),
    }


def event_dict(recorded: RecordedEvent) -> dict[str, Any]:
    """One trail entry: version, time, event name, actor, and the event's own fields."""
    event = recorded.event
    fields = event.model_dump(mode="json", exclude={"actor"})
    return {
        "version": recorded.version,
        "recorded_at": _iso(recorded.recorded_at),
        "event": type(event).__name__,
        "actor": event.actor,
        **fields,
    }


def _details(entry: dict[str, Any]) -> str:
    skip = {
        "version",
        "recorded_at",
        "event",
        "actor",
        "run_id",
        "payload",
        "result",
        "privacy",
        "request_digest",
    }
    parts = []
    for key, value in entry.items():
        if key in skip or value in (None, (), [], {}, 0, 0.0):
            continue
        parts.append(f"{key}={value}")
    return " ".join(parts)


def trail_table(events: Sequence[RecordedEvent]) -> Table:
    table = Table(title="Event trail", show_lines=False)
    for column in ("v", "recorded at (store clock)", "event", "actor", "details"):
        table.add_column(column, overflow="fold")
    for recorded in events:
        entry = event_dict(recorded)
        add_row(
            table,
            str(recorded.version),
            recorded.recorded_at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
            entry["event"],
            entry["actor"],
            _details(entry),
        )
    return table


def run_table(row: RunRow) -> Table:
    s = row.state
    table = Table(title=f"Run {s.run_id}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    pairs: list[tuple[str, Any]] = [
        ("agent", s.agent),
        ("status", s.status.value),
        ("queue", f"{s.queue} (priority {s.priority})"),
        (
            "concurrency key",
            f"{s.concurrency_key} (limit {s.concurrency_limit})" if s.concurrency_key else "-",
        ),
        ("reason", s.reason.value if s.reason else "-"),
        ("version", s.version),
        ("steps", s.steps),
        ("requeues", s.requeue_count),
        ("lease holder", s.holder or "-"),
        ("lease expires", _iso(row.lease_expires_at) or "-"),
        ("available at", _iso(row.available_at) or "-"),
        ("failure", f"{s.failure_class.value} ({s.error_type})" if s.failure_class else "-"),
        ("pending effects", ", ".join(f"{p.tool}@{p.seq}" for p in s.pending_effects) or "-"),
        ("waiting for", waiting_for(row)),
        ("pending calls", ", ".join(s.waiting.pending_tools) if s.waiting else "-"),
        ("digest", (s.waiting.digest or "-") if s.waiting else "-"),
        ("created", _iso(row.created_at)),
        ("updated", _iso(row.updated_at)),
    ]
    for key, value in pairs:
        add_row(table, key, value)
    return table


def waiting_for(row: RunRow) -> str:
    """What a waiting run waits for, in words: a timer and its wake-up, a signal by name,
    a person; with the deadline (the row's `available_at`, ADR 0073) if it has one."""
    waiting = row.state.waiting
    if waiting is None or not row.state.status.is_waiting:
        return "-"
    deadline = _iso(row.available_at)
    if waiting.kind.value == "timer":
        # A step waiting for its rate limit's window sleeps on a timer named after the
        # limit (ADR 0080).
        name = waiting.name or ""
        if name.startswith(RATE_LIMIT_TIMER):
            return f"rate limit {name.removeprefix(RATE_LIMIT_TIMER)!r} until {deadline}"
        return f"timer until {deadline}"
    what = f"signal {waiting.name!r}" if waiting.kind.value == "event" else waiting.kind.value
    return f"{what} until {deadline}" if deadline else what


def compact_runs_table(rows: Sequence[RunRow], title: str) -> Table:
    """Short ids and the ending only: fits an 80-column terminal (the demo's)."""
    table = Table(title=title)
    for column in ("run", "status", "reason", "steps", "requeues", "version"):
        table.add_column(column, no_wrap=True)
    for row in rows:
        s = row.state
        add_row(
            table,
            short_id(s.run_id),
            s.status.value,
            s.reason.value if s.reason else "-",
            str(s.steps),
            str(s.requeue_count),
            str(s.version),
        )
    return table


FULL_IDS_FROM = 120  # columns: narrower terminals get the short ids (ADR 0074)
# The columns a terminal too narrow for the whole table loses first, in this order: what
# says least about what to do next goes first; the id, agent, status and what a run waits
# for are never dropped (ADR 0074).
DROPPED_FIRST = ("requeues", "steps", "since", "reason", "key", "queue")
# The columns that narrow (their cells cut with an ellipsis) before one of DROPPED_FIRST
# is dropped, down to these widths; what the others leave goes to them in this order.
NARROWED = {"agent": 16, "waits for": 15}


def runs_table(rows: Sequence[RunRow], title: str = "Runs", *, width: int | None = None) -> Table:
    """The runs, one line each. The id is what people copy, so it is never wrapped or cut:
    in a terminal narrower than FULL_IDS_FROM columns the table shows the last 8 digits,
    which every command accepts as well. A `queue` column (name, and priority when not 0;
    ADR 0077) is shown when a run of the page is not on the default queue at priority 0,
    and a `key` column (the concurrency key; ADR 0078) when a run of the page has one. In
    a terminal of `width` columns too narrow for every column, `agent` and `waits for`
    narrow (NARROWED) and the columns of DROPPED_FIRST go, in that order, until the rest
    fit; a cell still too long for its column is cut with an ellipsis rather than folded
    (`show` has it whole)."""
    short = width is not None and width < FULL_IDS_FROM
    columns, held = _fitted(_runs_columns(rows, short), width)
    table = Table(title=title)
    for name, cells in columns:
        if name == "run":  # kept whole: as wide as its longest id
            table.add_column(name, no_wrap=True, min_width=max(map(len, cells), default=8))
        else:
            table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=held.get(name))
    for i in range(len(rows)):
        table.add_row(*(cells[i] for _, cells in columns))
    return table


def _runs_columns(rows: Sequence[RunRow], short: bool) -> list[tuple[str, list[str]]]:
    """Every column of `runs_table` as (name, inert cells)."""
    placed = any((r.state.queue, r.state.priority) != ("default", 0) for r in rows)
    keyed = any(r.state.concurrency_key is not None for r in rows)
    columns: dict[str, list[str]] = {}
    for row in rows:
        s = row.state
        waits = "-"
        if s.waiting is not None and s.waiting.kind.value in ("timer", "event"):
            waits = waiting_for(row)
        elif s.waiting is not None:
            what = ", ".join(s.waiting.pending_tools) or "input"
            waits = f"{s.waiting.kind.value}: {what} ({s.waiting.digest[:19]}…)"
        cells: dict[str, object] = {
            "run": short_id(s.run_id) if short else s.run_id,
            "agent": s.agent,
            "status": s.status.value,
        }
        if placed:
            cells["queue"] = f"{s.queue} ({s.priority})" if s.priority else s.queue
        if keyed:
            cells["key"] = s.concurrency_key or "-"
        cells.update(
            {
                "reason": s.reason.value if s.reason else "-",
                "steps": s.steps,
                "requeues": s.requeue_count,
                "since": row.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
                "waits for": waits,
            }
        )
        for name, value in cells.items():
            columns.setdefault(name, []).append(inert(value))
    if not rows:  # the headers of an empty page
        names = ["run", "agent", "status", "reason", "steps", "requeues", "since", "waits for"]
        return [(name, []) for name in names]
    return list(columns.items())


def _fitted(
    columns: list[tuple[str, list[str]]], width: int | None
) -> tuple[list[tuple[str, list[str]]], dict[str, int]]:
    """`columns` less those of DROPPED_FIRST, in order, until the table fits in `width`
    terminal columns, and the widths the NARROWED columns are held to. A column takes its
    header's or widest cell's width plus a border and a space either side; a column of
    NARROWED gives way down to its floor before a column is dropped for it, and gets back
    what the others leave, in NARROWED's order."""
    if width is None:
        return columns, {}

    def widest(name: str, cells: list[str]) -> int:
        return max([cell_len(name)] + [render_markup(c).cell_len for c in cells])

    def needed(kept: list[tuple[str, list[str]]]) -> int:
        return sum(min(widest(n, c), NARROWED.get(n, width)) + 3 for n, c in kept) + 1

    for name in DROPPED_FIRST:
        if needed(columns) <= width:
            break
        columns = [c for c in columns if c[0] != name]
    room = width - needed(columns)  # what is left once every narrowed column has its floor
    held: dict[str, int] = {}
    for name, cells in columns:
        floor = NARROWED.get(name)
        if floor is not None and widest(name, cells) > floor:
            held[name] = floor + min(max(room, 0), widest(name, cells) - floor)
            room -= held[name] - floor
    return columns, held


def print_run(console: Console, row: RunRow, events: Sequence[RecordedEvent]) -> None:
    console.print(run_table(row))
    console.print(trail_table(events))


def family_lines(family: Family) -> list[str]:
    """What `show` says of a run's parent and children (ADR 0075), plain text."""
    lines = []
    if family.parent is not None:
        pid, agent, status = family.parent
        lines.append(f"parent: {pid} {agent} {status.value}")
    elif family.parent_id is not None:
        gone = "purged" if family.parent_purged else "not found"
        lines.append(f"parent: {family.parent_id} ({gone})")
    if family.children:
        lines.append(f"children ({len(family.children)}):")
        lines += [f"  {cid} {agent} {status.value}" for cid, agent, status in family.children]
    return lines


def family_dict(family: Family) -> dict[str, Any]:
    """`show --json`'s `family`: the parent (id, agent, status, purged) and the children."""
    parent: dict[str, Any] | None = None
    if family.parent_id is not None:
        parent = {"id": str(family.parent_id), "purged": family.parent_purged}
        if family.parent is not None:
            parent.update(agent=family.parent[1], status=family.parent[2].value)
    return {
        "parent": parent,
        "children": [
            {"id": str(cid), "agent": agent, "status": status.value}
            for cid, agent, status in family.children
        ],
    }


def run_summary(run: Run) -> str:
    return f"{run.id} {run.status.value} v{run.version}"
