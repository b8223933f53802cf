"""The tutorial's agent: a support reply drafted by a (pretend) model and sent by a write tool
once a person approves it.

    steptrail --app examples.tutorial.support:app work

The "model" sleeps `think_seconds` (default 3) per call so that there is time to kill the
worker in the middle of one, and it notes every real call in `model-calls.log`; the write
tool appends to `outbox.txt`. Both files are in the current folder, so you can see from
outside the database what ran, and how often.
"""

from __future__ import annotations

import time
from pathlib import Path

import steptrail

# --8<-- [start:app]
app = steptrail.App()
app.tool("send_reply", effect="non_idempotent_write")  # never run twice, never unrecorded


def ask_model(task: str, request: dict) -> str:
    """Stands in for your LLM client: slow, and it leaves a line per real call."""
    time.sleep(request.get("think_seconds", 3))
    with Path("model-calls.log").open("a") as log:
        log.write(f"{task}\n")
    return f"{task} for {request['customer']}: {request['question']}"


def send_reply(to: str, body: str) -> str:
    with Path("outbox.txt").open("a") as outbox:
        outbox.write(f"to {to}: {body}\n")
    return "sent"


@app.agent("support")
def support(ctx: steptrail.RunContext, request: dict) -> dict:
    notes = ctx.llm("research", lambda: ask_model("research", request), args=request)
    draft = ctx.llm("draft", lambda: ask_model(f"draft from {notes!r}", request), args=request)
    decision = ctx.request_approval(  # the run waits here, holding no lease
        [{"name": "send_reply", "arguments": {"to": request["customer"], "body": draft}}]
    )
    results = ctx.run_pending({"send_reply": send_reply})  # runs once approved
    return {"approved": decision.approved, "sent": [r.error is None for r in results]}


# --8<-- [end:app]
