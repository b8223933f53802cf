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


app.tool("lookup", effect="read_only")
app.tool("pai_send", effect="non_idempotent_write")


@app.agent("pai_mailer")
async def pai_mailer(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
    """A pydantic-ai agent (two tools: `lookup` read, `pai_send` write) made durable by
    steptrail. Its FunctionModel appends a line per real model call to `model_log`, the
    write a line to `witness`; while the file `hang` exists the model hangs before its final
    answer (so a test can SIGKILL the worker mid-run, after the write). pydantic-ai is
    imported here, not at module import, so workers start fast without needing it."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    from steptrail.integrations.pydantic_ai import StepTrailDurability, run_agent

    async def model(messages: list[Any], info: Any) -> ModelResponse:
        returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        stage = returned[0].tool_name if returned else "start"
        with Path(request["model_log"]).open("a") as f:
            f.write(f"{ctx.run_id} {stage}\n")
        if stage == "start":
            return ModelResponse(parts=[ToolCallPart("lookup", {"city": "Oslo"}, "c1")])
        if stage == "lookup":
            args = {"to": "a@example.com", "body": str(returned[0].content)}
            return ModelResponse(parts=[ToolCallPart("pai_send", args, "c2")])
        while Path(request["hang"]).exists():
            await asyncio.sleep(0.05)
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), name="pai_mailer", capabilities=[StepTrailDurability()])

    @agent.tool_plain
    def lookup(city: str) -> str:
        return f"sunny in {city}"

    @agent.tool_plain
    def pai_send(to: str, body: str) -> str:
        with Path(request["witness"]).open("a") as f:
            f.write(f"{ctx.run_id} {to}\n")
        return "sent"

    result = await run_agent(ctx, agent, "weather, then mail it")
    return {"output": result.output}


app.tool("oa_send", effect="non_idempotent_write")


@app.agent("oa_mailer")
async def oa_mailer(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI Agents SDK agent (`lookup` read, `oa_send` a write that needs approval)
    made durable by steptrail. Its ScriptedModel appends a line per real model call to
    `model_log`, the write a line to `witness`; while the file `hang` exists `lookup` hangs
    (so a test can SIGKILL the worker after the first model call was recorded). The SDK is
    imported here, not at module import, so workers start fast without needing it."""
    from agents import Agent, function_tool, set_tracing_disabled
    from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message
    from agents.testing import function_call as call

    from steptrail.integrations import openai_agents

    set_tracing_disabled(True)

    def respond(model_call: ModelCall) -> Any:
        items = model_call.input if isinstance(model_call.input, list) else []
        outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
        stage = ("start", "lookup", "oa_send")[min(len(outputs), 2)]
        with Path(request["model_log"]).open("a") as f:
            f.write(f"{ctx.run_id} {stage}\n")
        if stage == "start":
            return [call("lookup", {"city": "Oslo"}, call_id="c1")]
        if stage == "lookup":
            return [call("oa_send", {"to": "a@example.com", "body": outputs[0]}, call_id="c2")]
        return [assistant_message(f"done: {outputs[-1]}")]

    @function_tool
    async def lookup(city: str) -> str:
        """The weather."""
        while Path(request["hang"]).exists():
            await asyncio.sleep(0.05)
        return f"sunny in {city}"

    @function_tool(needs_approval=True)
    def oa_send(to: str, body: str) -> str:
        """Send a mail."""
        with Path(request["witness"]).open("a") as f:
            f.write(f"{ctx.run_id} {to}\n")
        return "sent"

    model = ScriptedModel([ModelStep.respond(respond) for _ in range(10)])
    agent = Agent(name="oa_mailer", model=model, tools=[lookup, oa_send])
    result = await openai_agents.run(agent, "weather, then mail it")
    return {"output": result.final_output}


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


@app.agent("heavy_job", queue="heavy", priority=5)
def heavy_job(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    """A run of the `heavy` queue at priority 5 unless its enqueuer says otherwise (ADR
    0077): `work --queue heavy` serves it, a worker of the default queue never does."""
    return {"n": request.get("n")}


app.queue("bulk")


@app.agent("chaos_child")
def chaos_child(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    """A child of `chaos_parent`: two slow steps, then its number and square."""
    n, sleep = int(request["n"]), float(request.get("sleep", 0.1))
    for k in range(2):
        ctx.llm(f"work-{k + 1}", lambda: time.sleep(sleep) or "ok")
    return {"n": n, "square": n * n}


@app.agent("chaos_parent")
def chaos_parent(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    """Fans out to `n` children (ADR 0075), a slow step between each start, and waits for
    them all."""
    handles = []
    for n in range(int(request["n"])):
        handles.append(ctx.start_child("chaos_child", {"n": n, "sleep": request.get("sleep")}))
        ctx.llm(f"after-{n}", lambda: time.sleep(0.02) or "ok")
    return {"results": ctx.wait_all(handles)}
