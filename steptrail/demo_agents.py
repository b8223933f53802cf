"""Agents the demo adds to show async agents and, when the `pydantic-ai` extra is installed,
a pydantic-ai agent made durable by steptrail (offline: `TestModel`, no API key).

Nothing here is imported by `import steptrail`; the demo runs without the extra.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from steptrail.workers.async_context import AsyncRunContext
from steptrail.workers.registry import App


def demo_agents() -> tuple[App, list[str]]:
    """The demo's extra agents, and a note for each optional one that is missing."""
    app = App()
    notes: list[str] = []

    @app.agent("async_haiku")
    async def async_haiku(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        """Three awaited steps on the worker's event loop."""
        lines = []
        for k, words in enumerate(("an old silent pond", "a frog jumps in", "splash")):
            lines.append(await ctx.llm(f"line-{k + 1}", _slowly(words)))
        return {"haiku": " / ".join(lines)}

    try:
        from steptrail.integrations.pydantic_ai_example import weather_app
    except ImportError:
        notes.append("pip install 'steptrail[pydantic-ai]' to add the pydantic-ai agent")
        return app, notes
    app.include(weather_app())
    return app, notes


def _slowly(words: str) -> Callable[[], Awaitable[str]]:
    async def line() -> str:
        await asyncio.sleep(0.05)
        return words

    return line
