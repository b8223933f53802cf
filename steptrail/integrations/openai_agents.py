"""OpenAI Agents SDK agents made durable by steptrail (`pip install 'steptrail[openai-agents]'`).

`await run(agent, input)` inside an async steptrail agent runs an Agents SDK `Agent` the
way `Runner.run` does, with these rules (ADR 0071):

* **Every model call is a step.** The agent's model (whatever `RunConfig`/the agent names,
  resolved as the SDK resolves it) is wrapped so each `get_response` is `ctx.llm(...)`,
  named `<agent>.model`: the response is journaled (the SDK's own `ModelResponse`, as JSON)
  and its usage counted into the run's tokens. A recovered run hands recorded responses
  back instead of calling the model again.
* **Every function tool call is a step.** Each `FunctionTool` runs as `ctx.tool(name, ...,
  arguments=...)`, so the effect declared with `app.tool(name, effect=...)` applies (a tool
  nobody declared is a `non_idempotent_write`, behind a pending-effect marker) and a
  finished call is replayed, not run again. Steps of one run are positional, so the SDK's
  parallel tool calls of one turn take the journal one at a time, in the order they start.
* **`needs_approval` is a steptrail approval.** When the SDK's run stops with
  `interruptions`, the run waits for `steptrail approve/deny RUN --digest ...`, bound to the
  SHA-256 digest of each call's exact tool name, arguments and call id (so an approval
  quoted for other arguments is refused). On resume the agent function is called again,
  replays up to the same point, and the SDK's `RunState` gets `approve`/`reject`; a denied
  call reaches the model as the SDK sends any rejection: the tool's output "denied by the
  operator".

Outside an async steptrail run `run` refuses (`NotInSteptrailRun`). Not adapted (refused
rather than run without durability): handoffs, MCP servers, agents used as tools and
local computer/shell/patch tools. Streaming (`run_streamed`) is not adapted.

Example (offline, no API key): `examples/openai_agents_mailer.py`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, FunctionTool, Model, RunConfig, Runner, RunResult
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import ModelTracing
from agents.tool import ApplyPatchTool, ComputerTool, LocalShellTool, ShellTool, Tool
from agents.tool_context import ToolContext
from openai.types.responses.response_prompt_param import ResponsePromptParam
from pydantic import TypeAdapter

from steptrail.integrations._common import (
    DENIED,
    NotInSteptrailRun,
    pending_call,
    refusal,
)
from steptrail.workers.async_context import AsyncRunContext, current_run_context
from steptrail.workers.context import Recorded, jsonable

__all__ = ["CONVERSATION_KEY", "NotInSteptrailRun", "run"]

CONVERSATION_KEY = "openai_agents_items"
_RESPONSE = TypeAdapter(ModelResponse)
_LOCAL_TOOLS = (ComputerTool, LocalShellTool, ShellTool, ApplyPatchTool)


def _require_context() -> AsyncRunContext:
    ctx = current_run_context()
    if ctx is None:
        raise NotInSteptrailRun(
            refusal("this OpenAI Agents SDK run", "an async steptrail agent (`async def`)")
        )
    return ctx


class _DurableModel(Model):
    """The agent's model, each response taken as an `llm` step of the run."""

    def __init__(self, model: Model, name: str, ctx: AsyncRunContext, lock: asyncio.Lock) -> None:
        self._model = model
        self._name = name
        self._ctx = ctx
        self._lock = lock

    async def get_response(  # noqa: PLR0917 - the SDK's Model signature
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        async def call() -> Recorded[Any]:
            response = await self._model.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
            value = _RESPONSE.dump_python(response, mode="json")
            return Recorded(value, tokens=int(response.usage.total_tokens or 0))

        async with self._lock:
            recorded = await self._ctx.llm(self._name, call)
        return _RESPONSE.validate_python(recorded)

    def stream_response(  # noqa: PLR0917 - the SDK's Model signature
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("steptrail does not adapt streamed runs (use run, not streaming)")


def _durable_tool(tool: FunctionTool, ctx: AsyncRunContext, lock: asyncio.Lock) -> FunctionTool:
    invoke = tool.on_invoke_tool

    async def durable(tool_ctx: ToolContext[Any], input_json: str) -> Any:
        try:
            arguments = json.loads(input_json) if input_json else {}
        except ValueError:
            arguments = {"raw": input_json}
        if not isinstance(arguments, dict):
            arguments = {"value": arguments}
        async with lock:
            return await ctx.tool(
                tool.name, lambda: invoke(tool_ctx, input_json), arguments=arguments
            )

    # A shallow copy keeps the SDK's private bookkeeping (origin, namespace) of the tool.
    wrapped = copy.copy(tool)
    wrapped.on_invoke_tool = durable
    return wrapped


def _resolve_model(agent: Agent[Any], config: RunConfig) -> Model:
    """The model the SDK would call for `agent` under `config` (its own resolution order)."""
    if isinstance(config.model, Model):
        return config.model
    if isinstance(config.model, str):
        return config.model_provider.get_model(config.model)
    if isinstance(agent.model, Model):
        return agent.model
    return config.model_provider.get_model(agent.model)


def _durable_agent(
    agent: Agent[Any], config: RunConfig, ctx: AsyncRunContext, lock: asyncio.Lock
) -> Agent[Any]:
    if agent.handoffs or agent.mcp_servers:
        raise NotImplementedError(
            f"agent {agent.name!r}: handoffs and MCP servers are not made durable by steptrail"
        )
    tools: list[Tool] = []
    for tool in agent.tools:
        if isinstance(tool, FunctionTool):
            if getattr(tool, "_is_agent_tool", False):
                raise NotImplementedError(f"tool {tool.name!r}: agents as tools are not adapted")
            tools.append(_durable_tool(tool, ctx, lock))
        elif isinstance(tool, _LOCAL_TOOLS):
            raise NotImplementedError(f"tool {tool.name!r} runs locally outside steptrail steps")
        else:
            tools.append(tool)  # hosted tools run at the provider, inside the model response
    model = _DurableModel(_resolve_model(agent, config), f"{agent.name}.model", ctx, lock)
    return agent.clone(model=model, tools=tools)


async def run(
    agent: Agent[Any],
    input: str | list[TResponseInputItem],
    *,
    run_config: RunConfig | None = None,
    **kwargs: Any,
) -> RunResult:
    """Run `agent` on `input` durably inside the async steptrail agent executing now.

    Like `Runner.run(agent, input, ...)`, but every model call and function tool call is a
    journaled step, and a tool that `needs_approval` makes the run wait for a steptrail
    decision bound to its exact arguments (see the module docstring). Other keyword
    arguments go to `Runner.run`.

    Raises:
        NotInSteptrailRun: no async steptrail agent is executing in this task.
        NotImplementedError: the agent uses something steptrail cannot make durable.
    """
    ctx = _require_context()
    config = dataclasses.replace(run_config or RunConfig(), model=None)
    durable = _durable_agent(agent, run_config or RunConfig(), ctx, asyncio.Lock())
    result = await Runner.run(durable, input, run_config=config, **kwargs)
    while result.interruptions:
        pending = result.interruptions
        calls = [
            pending_call(
                str(item.tool_name),
                _arguments(getattr(item.raw_item, "arguments", None)),
                str(getattr(item.raw_item, "call_id", "")),
            )
            for item in pending
        ]
        decision = await ctx.request_approval(
            calls, conversation={CONVERSATION_KEY: jsonable(result.to_input_list())}
        )
        state = result.to_state()
        for item in pending:
            if decision.approved:
                state.approve(item)
            else:
                state.reject(item, rejection_message=DENIED)
        result = await Runner.run(durable, state, run_config=config, **kwargs)
    return result


def _arguments(raw: object) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            return {"raw": raw}
        return parsed if isinstance(parsed, dict) else {"value": parsed}
    return dict(raw) if isinstance(raw, dict) else {}
