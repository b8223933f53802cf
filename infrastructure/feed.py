"""The event feed: the log in the views' order, with positions a consumer can resume from.

`read_feed(after, limit)` returns the entries after a position, in (transaction, id) order,
under the same visibility rule as the views' runner (ADR 0012): on PostgreSQL only events of
transactions older than every one still running, which can no longer be joined by an event
that sorts before them. So a consumer that saves the position of the last entry it handled
and asks again from there never skips an event and never sees one twice, however many
writers append meanwhile.

A purged run's events are gone from the log; their positions stay known
(`steptrail_purged_events`), and the feed returns a purged entry at each, so a consumer can
tell "purged" from "lost" (ADR 0029). Payloads are the log's own, filtered by the privacy
level when they were recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from steptrail.domain.run import RunEvent
from steptrail.infrastructure.codec import decode_event
from steptrail.infrastructure.reporting_store import Dialect
from steptrail.projections.custom import Position


@dataclass(frozen=True)
class FeedEntry:
    """One position of the log: an event, or the marker of a purged one."""

    position: Position
    run_id: UUID
    version: int
    recorded_at: datetime | None
    event: RunEvent | None
    topic: str | None
    purged_at: datetime | None

    @property
    def purged(self) -> bool:
        return self.event is None


def format_position(position: Position) -> str:
    """A position as a consumer saves it: `TX:ID` (`0:ID` on SQLite)."""
    return f"{position[0]}:{position[1]}"


def parse_position(text: str) -> Position:
    """The position `format_position` wrote (a bare `ID` means `0:ID`).

    Raises:
        ValueError: not a position.
    """
    tx, sep, nid = text.strip().partition(":")
    try:
        position = (int(tx), int(nid)) if sep else (0, int(tx))
    except ValueError:
        raise ValueError(f"{text!r} is not a feed position (TX:ID)") from None
    if not all(0 <= part < 2**63 for part in position):  # both are bigint in the store
        raise ValueError(f"{text!r} is not a feed position (TX:ID)")
    return position


def read_feed(dialect: Dialect, *, after: Position = (0, 0), limit: int = 1000) -> list[FeedEntry]:
    """The next `limit` entries of the feed after `after`."""
    if limit < 1:
        raise ValueError("limit must be a positive integer")
    with dialect.reporting_read() as tx:
        rows = tx.all("select_feed", {"after_tx": after[0], "after": after[1], "limit": limit})
    return [_entry(dialect, r) for r in rows]


def _entry(dialect: Dialect, row: Any) -> FeedEntry:
    run_id = row["run_id"]
    topic = row["topic"]
    return FeedEntry(
        position=(int(row["tx_id"]), int(row["notification_id"])),
        run_id=run_id if isinstance(run_id, UUID) else UUID(run_id),
        version=int(row["version"]),
        recorded_at=dialect.py_time(row["recorded_at"]),
        event=(
            decode_event(
                topic, bytes(row["state"]), where=f"event {row['version']} of run {run_id}"
            )
            if topic is not None
            else None
        ),
        topic=topic,
        purged_at=dialect.py_time(row["purged_at"]),
    )
