"""Agents for the acceptance tests, loaded by `steptrail --app tests.acceptance.agents:app`.

`witnessed` writes a line to a file each time its write tool really runs, so a test can see
from outside whether a zombie worker ever acted.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from steptrail import App, AsyncRunContext, RunContext

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


@app.agent("witnessed_async")
async def witnessed_async(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
    """`witnessed` as an async agent: `steps` awaited steps, each appending a line
    `<run id> <step>` to `counter` (a file) when it really runs, then a real write to
    `witness`, then one more step."""
    sleep = float(request.get("sleep", 0.3))
    counter = Path(request["counter"])

    async def think(k: int) -> str:
        await asyncio.sleep(sleep)
        with counter.open("a") as f:
            f.write(f"{ctx.run_id} think-{k}\n")
        return "ok"

    for k in range(int(request.get("steps", 3))):
        await ctx.llm(f"think-{k + 1}", lambda k=k: think(k + 1))

    async def send() -> str:
        with Path(request["witness"]).open("a") as f:
            f.write(f"{ctx.run_id} {ctx.fencing_token}\n")
        return "sent"

    await ctx.tool("send_email", send)
    await ctx.llm("wrap-up", lambda: "done")
    return {}
