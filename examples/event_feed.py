"""Follow the event feed from Python: handle every event once, resuming from a saved position.

python -m examples.event_feed
"""

from __future__ import annotations

from pathlib import Path

import steptrail
from steptrail import events

app = steptrail.App()


@app.agent("triage")
def triage(ctx: steptrail.RunContext, request: dict) -> dict:
    return {"plan": ctx.llm("plan", lambda: f"plan for {request['ticket']}")}


# --8<-- [start:consumer]
SAVED = Path("feed-position.txt")  # wherever your consumer keeps its place


def consume(rt: steptrail.Runtime) -> int:
    """Hand every new entry to `handle`, then save the position reached."""
    after = steptrail.parse_position(SAVED.read_text()) if SAVED.exists() else (0, 0)
    handled = 0
    while batch := rt.events(after=after, limit=500):
        for entry in batch:
            handle(entry)
            handled += 1
        after = batch[-1].position
        SAVED.write_text(steptrail.format_position(after))  # after handling: at least once
    return handled


def handle(entry: steptrail.FeedEntry) -> None:
    if entry.purged:
        print("purged", entry.run_id, entry.version)  # purged, not lost
    elif isinstance(entry.event, events.Completed):
        print("completed", entry.run_id)


# --8<-- [end:consumer]


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        for ticket in ("T-1", "T-2"):
            rt.enqueue("triage", {"ticket": ticket})
        rt.work(burst=True)
        first = consume(rt)
        assert first > 0
        assert consume(rt) == 0  # nothing handled twice after a restart from the position
