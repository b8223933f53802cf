"""An OpenAI Agents SDK agent made durable by steptrail, offline (no API key): it looks
the weather up, then mails it with a tool that `needs_approval`. Needs the `openai-agents`
extra.

    steptrail --app examples.openai_agents_mailer:app enqueue mailer '{"city": "Oslo"}'
    steptrail --app examples.openai_agents_mailer:app work --burst   # waits at send_email
    steptrail --app examples.openai_agents_mailer:app approve RUN_ID --by alice --digest sha256:...

The model is the SDK's `ScriptedModel`, whose every step answers from what the
conversation holds (so a replayed run gets the same answers); `Counters` counts real model
calls and sent mails outside the database.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from agents import Agent, Usage, function_tool, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

import steptrail
from steptrail import AsyncRunContext
from steptrail.integrations import openai_agents


class Counters:
    """Real model calls by stage, and the mails really sent."""

    def __init__(self) -> None:
        self.model: Counter[str] = Counter()
        self.sent: list[dict[str, str]] = []
        self.seen: list[str] = []  # the tool outputs the model saw on its last call


def _outputs(call: ModelCall) -> list[str]:
    items = call.input if isinstance(call.input, list) else []
    return [
        str(i.get("output"))
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]


def mailer_agent(counters: Counters, city: str = "Oslo") -> Agent[Any]:
    """lookup (read) → send_email (a write that needs approval) → a final answer."""

    def respond(call: ModelCall) -> Any:
        outputs = _outputs(call)
        counters.seen = outputs
        stage = ("start", "lookup", "send_email")[min(len(outputs), 2)]
        counters.model[stage] += 1
        if stage == "start":
            return [function_call("lookup", {"city": city}, call_id="c1")]
        if stage == "lookup":
            mail = {"to": "a@example.com", "body": outputs[0]}
            return [function_call("send_email", mail, call_id="c2")]
        return [assistant_message(f"done: {outputs[-1]}")]

    @function_tool
    def lookup(city: str) -> str:
        """The weather in `city`."""
        return f"sunny in {city}"

    @function_tool(needs_approval=True)
    def send_email(to: str, body: str) -> str:
        """Send a mail."""
        counters.sent.append({"to": to, "body": body})
        return "sent"

    usage = Usage(requests=1, input_tokens=12, output_tokens=8, total_tokens=20)
    model = ScriptedModel([ModelStep.respond(respond) for _ in range(20)], default_usage=usage)
    return Agent(name="mailer", model=model, tools=[lookup, send_email])


# --8<-- [start:app]
def mailer_app(counters: Counters | None = None) -> steptrail.App:
    """An App with the agent `mailer`: `lookup` is read-only, `send_email` a write."""
    set_tracing_disabled(True)  # offline: no trace export to OpenAI
    counters = counters or Counters()
    app = steptrail.App()
    app.tool("lookup", effect="read_only")
    app.tool("send_email", effect="non_idempotent_write")

    @app.agent("mailer")
    async def mailer(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        agent = mailer_agent(counters, request.get("city", "Oslo"))
        result = await openai_agents.run(agent, "Mail the weather to a@example.com")
        return {"output": result.final_output}

    return app


# --8<-- [end:app]


app = mailer_app()
