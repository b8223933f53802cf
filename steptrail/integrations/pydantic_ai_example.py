"""The offline pydantic-ai example the demo runs (needs the `pydantic-ai` extra): a
`TestModel` agent with a read tool and a write tool that requires approval, made durable by
steptrail. Same shape as examples/pydantic_ai_agent.py, the pydantic-ai guide's example."""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from steptrail.integrations.pydantic_ai import StepTrailDurability, run_agent
from steptrail.workers.async_context import AsyncRunContext
from steptrail.workers.registry import App


def weather_app() -> App:
    """An App with the `weather_helper` agent; its `send_report` call waits for approval."""
    agent = Agent(TestModel(), name="weather_helper", capabilities=[StepTrailDurability()])

    @agent.tool_plain
    def forecast(city: str) -> str:
        return f"sunny in {city}"

    @agent.tool_plain(requires_approval=True)
    def send_report(to: str, body: str) -> str:
        return "sent"

    app = App()
    app.tool("forecast", effect="read_only")
    app.tool("send_report", effect="non_idempotent_write")

    @app.agent("weather_helper")
    async def weather_helper(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        result = await run_agent(ctx, agent, request.get("prompt", "weather, then report"))
        return {"output": result.output}

    return app
