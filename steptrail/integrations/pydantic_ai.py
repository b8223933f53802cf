"""pydantic-ai agents made durable by steptrail (`pip install 'steptrail[pydantic-ai]'`).

Built on pydantic-ai's public, engine-neutral durable execution API, like its own Temporal,
DBOS and Prefect integrations: `StepTrailDurability` is a `BaseDurabilityCapability` whose
operation backend runs each durable unit as a steptrail step of the run that is executing
the agent —

* a **model request** is `ctx.llm(...)`: recorded (filtered by the privacy level), its
  tokens and cost counted from the response's usage, journaled and replayed by steptrail;
* a **tool call** is `ctx.tool(name, ..., arguments=...)`: its effect is the one declared
  with `app.tool(name, effect=...)` (a tool nobody declared is a `non_idempotent_write`), so
  a write's pending-effect marker is durable before the tool runs;
* a tool with `requires_approval=True` ends the agent run with pydantic-ai's deferred tool
  requests; `run_agent` turns them into `ctx.request_approval(...)`, so the run waits for
  `steptrail approve/deny`, with the decision bound to the SHA-256 digest of the exact tool
  names, arguments and call ids. On resume the agent's steps replay from the journal to the
  same point and the decision is taken there; an approved call runs (as a tool step), a
  denied one reaches the model as the tool's result "denied by the operator" (a tool return
  whose outcome is `denied`).

Steps of one segment are positional, so tool calls run one at a time inside a run. Outside a
steptrail run (or inside a synchronous agent) the capability refuses to run the agent,
rather than run it silently without durability.

Example (offline, no API key):

    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel
    from steptrail.integrations.pydantic_ai import StepTrailDurability, run_agent

    app = steptrail.App()
    app.tool("lookup", effect="read_only")
    agent = Agent(TestModel(), name="helper", capabilities=[StepTrailDurability()])

    @agent.tool_plain
    def lookup(city: str) -> str: ...

    @app.agent("helper")
    async def helper(ctx, request):
        result = await run_agent(ctx, agent, request["prompt"])
        return {"output": result.output}
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic

from pydantic import TypeAdapter
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    ToolDenied,
)
from pydantic_ai.agent import AgentRunResult
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.durable_exec import EventStreamHandlerId as _EventStreamHandlerId
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelResponse
from pydantic_ai.tools import AgentDepsT
from pydantic_core import to_jsonable_python

from steptrail.domain.decisions import DENIED
from steptrail.integrations import _common
from steptrail.workers.async_context import AsyncRunContext, current_run_context
from steptrail.workers.context import Recorded

__all__ = ["NotInSteptrailRun", "StepTrailDurability", "run_agent"]

CONVERSATION_KEY = "pydantic_ai_messages"
_RESPONSE = TypeAdapter(ModelResponse)


class NotInSteptrailRun(UserError, _common.NotInSteptrailRun):
    """A steptrail-durable pydantic-ai agent was run outside an async steptrail run (a
    pydantic-ai `UserError`, and the `NotInSteptrailRun` every integration raises)."""


@dataclass(frozen=True)
class _NoConfig:
    """steptrail takes its per-tool settings from `App.tool`, not from pydantic-ai metadata."""


_CONFIG = _NoConfig()


class _StepTrailBackend(JournalCallableOperationBackend[_NoConfig]):
    """Each durable unit is one step of the steptrail run executing the agent."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: _NoConfig,
    ) -> object:
        ctx = _require_context()
        if isinstance(operation_id, ModelRequestId):
            return await ctx.llm(name, lambda: _model_request(body))
        if isinstance(operation_id, ToolsetCallToolId):  # function, MCP and dynamic tools
            # The call's cache identity starts with the tool's name and its arguments.
            tool, arguments = str(cache_key[0]), cache_key[1]
            args = dict(arguments) if isinstance(arguments, dict) else None
            return await ctx.tool(tool, body, arguments=args)
        if isinstance(operation_id, ToolsetValidateToolArgumentsId | _EventStreamHandlerId):
            # Argument validation is pure and event delivery is the caller's own: neither is
            # a step (a replayed model response is validated again, the same way).
            return await body()
        # Anything else (discovery, compaction, capability operations; the union grows in
        # minor releases) is one plain step.
        return await ctx.step("pydantic_ai", name, body)


async def _model_request(body: Callable[[], Awaitable[object]]) -> Recorded[object]:
    payload = await body()
    tokens, cost = 0, 0.0
    try:
        response = _RESPONSE.validate_python(payload)
    except ValueError:
        return Recorded(payload)
    usage = response.usage
    tokens = int(usage.input_tokens or 0) + int(usage.output_tokens or 0)
    try:
        cost = float(response.cost().total_price)
    except (LookupError, ValueError, TypeError, AssertionError):
        cost = 0.0  # a model genai-prices does not know (e.g. TestModel, FunctionModel)
    return Recorded(payload, tokens=tokens, cost=cost)


def _require_context() -> AsyncRunContext:
    ctx = current_run_context()
    if ctx is None:
        raise NotInSteptrailRun(
            "this pydantic-ai agent is durable with steptrail and runs only inside an async "
            "steptrail agent (`@app.agent` on an `async def`); it refuses to run without "
            "durability"
        )
    return ctx


class StepTrailDurability(BaseDurabilityCapability[AgentDepsT], Generic[AgentDepsT]):
    """The capability that makes a pydantic-ai `Agent` durable inside steptrail runs.

    Args:
        name: the name of the agent's durable units (default: the agent's `name`).
        models: extra models, by id, that a run may switch to (as with the other engines).

    Every model request and tool call of the agent becomes a step of the steptrail run
    that executes it (see the module docstring).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="steptrail",
        durable_unit_noun="step",
        durable_container_noun="run",
        # Step results are journaled beside the log as JSON.
        codec=JSON_CODEC,
        # Toolsets handed to one `agent.run(...)` bypass the wrapping (and the markers).
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        journal_discovery=True,
        # A segment's steps are positional and appended one at a time.
        sequential_tools_in_durable_context=True,
        tool_config_key="steptrail",
    )

    def __init__(self, *, name: str | None = None, models: dict[str, Any] | None = None) -> None:
        super().__init__(models=models, name=name)

    @property
    def in_durable_context(self) -> bool:
        return current_run_context() is not None

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        config = RoleBasedOperationConfig(
            model=_CONFIG, event=_CONFIG, capability=_CONFIG, tool=_CONFIG
        )
        return _StepTrailBackend(
            agent_name=self.name, default_model_id=self.default_model_id, config=config
        )

    async def wrap_run(self, ctx: Any, *, handler: Any) -> AgentRunResult[Any]:
        _require_context()
        result: AgentRunResult[Any] = await super().wrap_run(ctx, handler=handler)
        return result


async def run_agent(
    ctx: AsyncRunContext,
    agent: Agent[Any, Any],
    user_prompt: str | Sequence[Any] | None = None,
    *,
    output_type: Any = None,
    **kwargs: Any,
) -> AgentRunResult[Any]:
    """Run `agent` (made durable with `StepTrailDurability`) inside a steptrail run, with
    approval-required tools suspending the run for a person's decision.

    When the agent calls a tool that requires approval, the run waits for `steptrail
    approve/deny RUN --digest ...` (the conversation so far is saved for the operator to
    read). When it resumes, the agent function is called again: this call replays the
    agent's model requests and tool calls from the journal up to the same point, takes the
    decision, and goes on — approved calls run (as tool steps, with their markers), denied
    ones return "denied by the operator" to the model as the tool's result. Other keyword
    arguments go to `agent.run`.

    Raises:
        NotInSteptrailRun: `ctx` is not the context of the run executing now.
        UserError: the agent deferred a call for external execution (not supported).
    """
    if current_run_context() is not ctx:
        raise NotInSteptrailRun("run_agent needs the context of the async agent running it")
    wanted = output_type if output_type is not None else agent.output_type
    outputs = [*(wanted if isinstance(wanted, list) else [wanted]), DeferredToolRequests]
    result: AgentRunResult[Any] = await agent.run(user_prompt, output_type=outputs, **kwargs)
    while isinstance(requests := result.output, DeferredToolRequests):
        if requests.calls:
            raise UserError(
                "steptrail runs pydantic-ai tools itself; a call deferred for external "
                f"execution ({', '.join(c.tool_name for c in requests.calls)}) is not supported"
            )
        decision = await ctx.request_approval(
            [
                {"name": c.tool_name, "arguments": c.args_as_dict(), "id": c.tool_call_id}
                for c in requests.approvals
            ],
            conversation={CONVERSATION_KEY: to_jsonable_python(result.all_messages())},
        )
        answer: bool | ToolDenied = True if decision.approved else ToolDenied(DENIED)
        deferred = DeferredToolResults(
            approvals={c.tool_call_id: answer for c in requests.approvals}
        )
        kwargs["message_history"] = result.all_messages()
        result = await agent.run(
            None, output_type=outputs, deferred_tool_results=deferred, **kwargs
        )
    return result
