"""A pydantic-ai agent made durable by steptrail, offline (TestModel: no API key).

python -m examples.pydantic_ai_agent     # needs steptrail[pydantic-ai]
"""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

import steptrail
from steptrail.integrations.pydantic_ai import StepTrailDurability, run_agent

agent = Agent(TestModel(), name="helper", capabilities=[StepTrailDurability()])


@agent.tool_plain
def lookup(city: str) -> str:
    return f"sunny in {city}"


@agent.tool_plain(requires_approval=True)  # waits for `steptrail approve/deny`
def send_report(to: str, body: str) -> str:
    return "sent"


app = steptrail.App()
app.tool("lookup", effect="read_only")
app.tool("send_report", effect="non_idempotent_write")


@app.agent("helper")
async def helper(ctx: steptrail.AsyncRunContext, request: dict) -> dict:
    result = await run_agent(ctx, agent, request["prompt"])
    return {"output": result.output}


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        run_id = rt.enqueue("helper", {"prompt": "weather in Paris, then report it"})
        rt.work(burst=True)  # suspends at send_report
        pending = rt.pending(run_id)  # the calls, with their SHA-256 digest
        rt.approve(run_id, by="alice", digest=pending.digest)
        rt.work(burst=True)  # replays to the approval, runs send_report
        print(rt.get(run_id).status)  # completed
