"""pydantic-ai agents made durable by steptrail, offline with `FunctionModel`, on both
backends: model requests and tool calls as steps, effects and markers, tokens from usage,
approval suspend/resume bound to a digest, denial reaching the model, loud refusal outside
a steptrail run."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any
from uuid import UUID

import pytest

# scripts/test installs the extra; under CI=true a missing extra fails at the import below.
if os.environ.get("CI", "").lower() != "true":
    pytest.importorskip("pydantic_ai", reason="install the extra: pip install -e '.[pydantic-ai]'")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import steptrail
from steptrail import App, AsyncRunContext, RunContext
from steptrail.domain.enums import Outcome, RunStatus
from steptrail.domain.errors import DigestMismatch
from steptrail.domain.run import Run
from steptrail.integrations.pydantic_ai import NotInSteptrailRun, StepTrailDurability, run_agent
from steptrail.runtime import Runtime
from tests.conftest import make_runtime


class Mailer:
    """A two-tool pydantic-ai agent (a read `lookup`, a write `send_email`) whose
    `FunctionModel` counts its calls; `send_email` counts its real executions."""

    def __init__(self, *, approval: bool = False) -> None:
        self.model_calls = 0
        self.sent = 0
        self.seen_by_model: list[ModelMessage] = []
        self.agent = Agent(
            FunctionModel(self.model), name="mailer", capabilities=[StepTrailDurability()]
        )

        @self.agent.tool_plain
        def lookup(city: str) -> str:
            return f"sunny in {city}"

        @self.agent.tool_plain(requires_approval=approval)
        def send_email(to: str, body: str) -> str:
            self.sent += 1
            return "sent"

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.model_calls += 1
        self.seen_by_model = list(messages)
        returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if not returned:
            return ModelResponse(parts=[ToolCallPart("lookup", {"city": "Paris"}, "c1")])
        if returned[0].tool_name == "lookup":
            args = {"to": "a@example.com", "body": returned[0].content}
            return ModelResponse(parts=[ToolCallPart("send_email", args, "c2")])
        return ModelResponse(parts=[TextPart(f"done: {returned[0].content}")])

    def app(self, *, declare_write: bool = True) -> App:
        app = App()
        app.tool("lookup", effect="read_only")
        if declare_write:
            app.tool("send_email", effect="non_idempotent_write")
        agent = self.agent

        @app.agent("mailer")
        async def mailer(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
            result = await run_agent(ctx, agent, request["prompt"])
            return {"output": result.output}

        return app


def steps(rt: Runtime, run_id: UUID) -> list[Run.StepRecorded]:
    return [h.event for h in rt.history(run_id) if isinstance(h.event, Run.StepRecorded)]


def test_pydantic_ai__model_requests_and_tools_recorded_as_steps(db_url: str) -> None:
    """Each model request is an `llm` step with tokens from its usage; each tool call a
    `tool` step under its declared effect, the write behind a durable marker."""
    mailer = Mailer()
    rt = make_runtime(db_url, app=mailer.app())
    try:
        run_id = rt.enqueue("mailer", {"prompt": "weather, then mail it"})
        assert rt.work(burst=True).outcomes == {"completed": 1}
        recorded = steps(rt, run_id)
        assert [(s.kind, s.name) for s in recorded] == [
            ("llm", "mailer__model.request"),
            ("tool", "lookup"),
            ("llm", "mailer__model.request"),
            ("tool", "send_email"),
            ("llm", "mailer__model.request"),
        ]
        assert (mailer.model_calls, mailer.sent) == (3, 1)
        assert all(s.tokens > 0 for s in recorded if s.kind == "llm")
        state = rt.get(run_id).state
        assert state.tokens == sum(s.tokens for s in recorded) > 0
        trail = [type(h.event).__name__ for h in rt.history(run_id)]
        assert trail.count("EffectPending") == 1
        assert trail.index("EffectPending") == trail.index("StepRecorded") + 3
        assert state.pending_effects == ()
        assert "sunny" not in str([s.payload for s in recorded])  # metadata privacy level
    finally:
        rt.close()


def test_pydantic_ai__undeclared_tool_is_a_non_idempotent_write(db_url: str) -> None:
    """A tool nobody declared to steptrail gets a pending-effect marker as a
    `non_idempotent_write` before it runs."""
    mailer = Mailer()
    rt = make_runtime(db_url, app=mailer.app(declare_write=False))
    try:
        run_id = rt.enqueue("mailer", {"prompt": "go"})
        rt.work(burst=True)
        marker = next(h.event for h in rt.history(run_id) if isinstance(h.event, Run.EffectPending))
        assert (marker.tool, marker.effect.value) == ("send_email", "non_idempotent_write")
        assert rt.get(run_id).status is RunStatus.COMPLETED
    finally:
        rt.close()


def test_pydantic_ai__approval_suspends_right_digest_resumes_wrong_refused(db_url: str) -> None:
    """An approval-required tool call suspends the run before it runs; a wrong digest is
    refused; the right one resumes the conversation, the call runs once, the model is not
    asked again for what it already answered."""
    mailer = Mailer(approval=True)
    rt = make_runtime(db_url, app=mailer.app())
    try:
        run_id = rt.enqueue("mailer", {"prompt": "go"})
        assert rt.work(burst=True).outcomes == {"awaiting_approval": 1}
        assert (mailer.model_calls, mailer.sent) == (2, 0)
        pending = rt.pending(run_id)
        assert [(c.name, c.arguments, c.id) for c in pending.calls] == [
            ("send_email", {"to": "a@example.com", "body": "sunny in Paris"}, "c2")
        ]
        with pytest.raises(DigestMismatch):
            rt.approve(run_id, by="alice", digest="sha256:" + "0" * 64)
        assert (rt.get(run_id).status, mailer.sent) == (RunStatus.WAITING_FOR_APPROVAL, 0)
        assert rt.approve(run_id, by="alice", digest=pending.digest).outcome is Outcome.REQUEUED
        rt.work(burst=True)
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert (mailer.model_calls, mailer.sent) == (3, 1)
        names = [(s.kind, s.name) for s in steps(rt, run_id)]
        assert names.count(("tool", "send_email")) == 1
    finally:
        rt.close()


def test_pydantic_ai__digest_binds_the_exact_tool_name_and_arguments(db_url: str) -> None:
    """The digest the decision must quote is the SHA-256 of the exact pending calls: other
    arguments give another digest."""
    from steptrail.domain.decisions import PendingCall, calls_digest

    mailer = Mailer(approval=True)
    rt = make_runtime(db_url, app=mailer.app())
    try:
        run_id = rt.enqueue("mailer", {"prompt": "go"})
        rt.work(burst=True)
        pending = rt.pending(run_id)
        assert pending.digest == calls_digest(pending.calls)
        assert pending.digest.startswith("sha256:")
        tampered = [PendingCall(name="send_email", arguments={"to": "b@example.com"}, id="c2")]
        assert calls_digest(tampered) != pending.digest
    finally:
        rt.close()


def test_pydantic_ai__denial_reaches_the_model_as_the_tools_result(db_url: str) -> None:
    """A denied call never runs; the model receives its tool return, outcome `denied`,
    "denied by the operator", and the run completes."""
    mailer = Mailer(approval=True)
    rt = make_runtime(db_url, app=mailer.app())
    try:
        run_id = rt.enqueue("mailer", {"prompt": "go"})
        rt.work(burst=True)
        digest = rt.pending(run_id).digest
        rt.deny(run_id, by="bob", digest=digest)
        rt.work(burst=True)
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert mailer.sent == 0
        last = mailer.seen_by_model[-1]
        (denied,) = [p for p in last.parts if isinstance(p, ToolReturnPart)]
        assert (denied.tool_name, denied.content) == ("send_email", "denied by the operator")
        assert denied.outcome == "denied"
        assert not any(isinstance(h.event, Run.EffectPending) for h in rt.history(run_id))
    finally:
        rt.close()


def test_pydantic_ai__outside_a_steptrail_run_refuses_loudly(runtime: Runtime) -> None:
    """The durable agent refuses to run outside a steptrail run, and inside a synchronous
    steptrail agent, rather than run without durability."""
    agent = Agent(TestModel(), name="plain", capabilities=[StepTrailDurability()])
    with pytest.raises(NotInSteptrailRun):
        asyncio.run(agent.run("hello"))

    app = App()

    @app.agent("sync_host")
    def sync_host(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {"output": agent.run_sync("hello").output}

    runtime.app.include(app)
    run_id = runtime.enqueue("sync_host", {})
    runtime.work(burst=True)
    row = runtime.get(run_id)
    assert row.status is RunStatus.FAILED
    assert runtime.history(run_id)[-1].event.error_type == "NotInSteptrailRun"  # type: ignore[union-attr]


def test_pydantic_ai__test_model_agent_through_open_async(db_url: str) -> None:
    """The pydantic-ai guide's offline example: a `TestModel` agent with one read tool, run through
    the async facade; every model request and tool call is a step."""
    agent = Agent(TestModel(), name="helper", capabilities=[StepTrailDurability()])

    @agent.tool_plain
    def lookup(city: str) -> str:
        return f"sunny in {city}"

    app = App()
    app.tool("lookup", effect="read_only")

    @app.agent("helper")
    async def helper(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        result = await run_agent(ctx, agent, request["prompt"])
        return {"output": result.output}

    async def scenario() -> Counter[str]:
        settings = steptrail.Settings(database_url=db_url, lease_seconds=5)
        async with steptrail.open_async(app, settings=settings) as rt:
            run_id = await rt.enqueue("helper", {"prompt": "weather in Paris?"})
            await rt.work(burst=True)
            assert (await rt.get(run_id)).status is RunStatus.COMPLETED
            history = await rt.history(run_id)
            return Counter(h.event.kind for h in history if isinstance(h.event, Run.StepRecorded))

    assert asyncio.run(scenario()) == Counter({"llm": 2, "tool": 1})
