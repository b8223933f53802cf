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
