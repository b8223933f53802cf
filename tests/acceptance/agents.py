"""Agents for the acceptance tests, loaded by `steptrail --app tests.acceptance.agents:app`.

`witnessed` writes a line to a file each time its write tool really runs, so a test can see
from outside whether a zombie worker ever acted.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from steptrail import App, RunContext

app = App()
app.tool("send_email", effect="non_idempotent_write")


@app.agent("witnessed")
def witnessed(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    """`steps` slow steps, then a real write to `witness` (a file path), then one more step."""
    sleep = float(request.get("sleep", 0.3))
    for k in range(int(request.get("steps", 3))):
        ctx.llm(f"think-{k + 1}", lambda: time.sleep(sleep) or "ok")

    def send() -> str:
        with Path(request["witness"]).open("a") as f:
            f.write(f"{ctx.fencing_token}\n")
        return "sent"

    ctx.tool("send_email", send)
    ctx.llm("wrap-up", lambda: "done")
    return {}


def nested(levels: int) -> Any:
    """A value `levels` arrays deep."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


@app.agent("deep")
def deep(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    """Builds a value `levels` deep itself (the request stays small) and puts it `where`:
    in a step's result, the run's result, or the conversation saved at an approval."""
    value = nested(int(request["levels"]))
    where = request.get("where", "result")
    if where == "step":
        ctx.llm("deep-step", lambda: value)
    if where == "conversation":
        ctx.request_approval([{"name": "send_email"}], conversation=value)
    return {"value": value} if where == "result" else {}


@app.agent("asks")
def asks(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    """Waits for input against whatever schema the request carries (unchecked by a request
    model, unlike the scripted agent), then completes."""
    if ctx.resumed is None:
        ctx.request_input(request["schema"], prompt="?")
    return {"keys": sorted(ctx.resumed.values or {})}
