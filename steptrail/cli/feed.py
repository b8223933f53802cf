"""`steptrail events`: the log as a feed a consumer can resume (ADR 0029)."""

from __future__ import annotations

import json
import sys
import threading
from typing import TYPE_CHECKING, Annotated, Any

import typer

from steptrail.cli.app import cli, fail, runtime, stop_on_signals
from steptrail.cli.runs import MAX_EVERY_S

if TYPE_CHECKING:  # imported where used (ADR 0043)
    from steptrail.infrastructure.feed import FeedEntry

BATCH = 1000
MAX_ENTRIES = 10**12  # a bound like every integer option's (a feed is long, not endless)


def feed_dict(entry: FeedEntry) -> dict[str, Any]:
    """One feed entry as JSON-compatible data: an event with its payload under `data`, or
    the marker of a purged event."""
    from steptrail.infrastructure.feed import format_position

    base: dict[str, Any] = {
        "position": format_position(entry.position),
        "run_id": str(entry.run_id),
        "version": entry.version,
    }
    if entry.event is None:
        purged_at = entry.purged_at.isoformat() if entry.purged_at else None
        return {**base, "purged": True, "purged_at": purged_at}
    return {
        **base,
        "recorded_at": entry.recorded_at.isoformat() if entry.recorded_at else None,
        "topic": entry.topic,
        "event": type(entry.event).__name__,
        "actor": entry.event.actor,
        "data": entry.event.model_dump(mode="json", exclude={"actor"}),
    }


def _line(entry: FeedEntry, as_json: bool) -> str:
    if as_json:
        return json.dumps(feed_dict(entry), separators=(",", ":"))
    from steptrail.infrastructure.feed import format_position

    position = format_position(entry.position)
    if entry.event is None:
        return f"{position}\t{entry.run_id}\tv{entry.version}\t(purged)"
    at = entry.recorded_at.isoformat() if entry.recorded_at else "-"
    return f"{position}\t{entry.run_id}\tv{entry.version}\t{type(entry.event).__name__}\t{at}"


@cli.command()
def events(
    ctx: typer.Context,
    after: Annotated[
        str,
        typer.Option(
            "--after",
            metavar="POSITION",
            help="Start after this position (TX:ID, as printed with each entry; 0 = the start).",
        ),
    ] = "0:0",
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep waiting for new events.")
    ] = False,
    every: Annotated[
        float,
        typer.Option(
            "--every",
            min=0.01,
            max=MAX_EVERY_S,
            metavar="SECONDS",
            help="With --follow: poll interval.",
        ),
    ] = 0.5,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, max=MAX_ENTRIES, help="Stop after this many entries."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Stream the event log in the views' order, one line per event, each with a position
    to resume from (`--after`): never an event skipped or repeated across a resume, even
    while workers append. Payloads are as the log holds them (filtered by the privacy
    level); a purged run's events appear as `purged` markers at their positions."""
    from steptrail.infrastructure.feed import parse_position

    try:
        position = parse_position(after)
    except ValueError as error:
        fail(str(error), 2)
    stop = threading.Event()
    if follow:
        stop_on_signals(stop.set)
    emitted = 0
    with runtime(ctx) as rt:
        while not stop.is_set():
            want = BATCH if limit is None else min(BATCH, limit - emitted)
            entries = rt.events(after=position, limit=want)
            if entries:
                try:
                    sys.stdout.write("".join(_line(e, as_json) + "\n" for e in entries))
                    sys.stdout.flush()
                except BrokenPipeError:  # the consumer went away: that is its resume point
                    return
                position = entries[-1].position
                emitted += len(entries)
            if limit is not None and emitted >= limit:
                return
            if len(entries) < want:
                if not follow:
                    return
                stop.wait(every)
