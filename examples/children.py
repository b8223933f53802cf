"""A planner fans out to researchers as child runs and waits for them all (ADR 0075).

python -m examples.children
"""

from __future__ import annotations

import steptrail

app = steptrail.App()


# --8<-- [start:agent]
@app.agent("researcher")
def researcher(ctx: steptrail.RunContext, request: dict) -> dict:
    notes = ctx.llm("read", lambda: f"notes on {request['topic']}")
    return {"topic": request["topic"], "notes": notes}


@app.agent("planner")
def planner(ctx: steptrail.RunContext, request: dict) -> dict:
    # Each child is started once, however often the planner crashes and replays.
    handles = [ctx.start_child("researcher", {"topic": t}, key=t) for t in request["topics"]]
    try:
        found = ctx.wait_all(handles, timeout=3600)  # no lease, no slot while it waits
    except steptrail.ChildFailed as failed:  # a child failed for good, or was cancelled
        return {"error": f"{failed.child_id}: {failed.failure_class or failed.status}"}
    return {"report": [f["notes"] for f in found]}


# --8<-- [end:agent]


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        # --8<-- [start:drive]
        run_id = rt.enqueue("planner", {"topics": ["tides", "winds"]})
        while not rt.get(run_id).status.is_terminal:
            rt.work(burst=True)  # the planner, then its children, then the woken planner
        for child_id, agent, status in rt.family(run_id).children:  # show lists them too
            print(child_id, agent, status.value)
        # --8<-- [end:drive]
        print(rt.get(run_id).status)
