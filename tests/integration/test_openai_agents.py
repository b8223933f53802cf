"""OpenAI Agents SDK agents made durable by steptrail, offline with the SDK's
`ScriptedModel`, on both backends: model and tool calls as steps, `needs_approval` as an
approval bound to the exact arguments, a denial reaching the model, loud refusal outside a
steptrail run and of what is not adapted."""

from __future__ import annotations

import asyncio
import os
from typing import Any
from uuid import UUID

import pytest

# scripts/test installs the extra; under CI=true a missing extra fails at the import below.
if os.environ.get("CI", "").lower() != "true":
    pytest.importorskip("agents", reason="install the extra: pip install -e '.[openai-agents]'")

from agents import Agent

import steptrail
from examples.openai_agents_mailer import Counters, mailer_agent, mailer_app
from steptrail import AsyncRunContext, RunContext
from steptrail.domain.decisions import PendingCall, calls_digest
from steptrail.domain.enums import Outcome, RunStatus
from steptrail.domain.errors import DigestMismatch
from steptrail.domain.run import Run
from steptrail.integrations import openai_agents
from steptrail.integrations.openai_agents import NotInSteptrailRun
from steptrail.runtime import Runtime
from tests.conftest import make_runtime

MAIL = {"to": "a@example.com", "body": "sunny in Oslo"}


def steps(rt: Runtime, run_id: UUID) -> list[Run.StepRecorded]:
    return [h.event for h in rt.history(run_id) if isinstance(h.event, Run.StepRecorded)]


def test_openai_agents__model_and_tool_calls_are_steps_approval_resumes(db_url: str) -> None:
    """Each model call is an `llm` step (tokens from its usage), each tool call a `tool`
    step under its declared effect; `needs_approval` suspends before the call runs, and the
    approved run does not call the model again for what it already answered."""
    counters = Counters()
    rt = make_runtime(db_url, app=mailer_app(counters))
    try:
        run_id = rt.enqueue("mailer", {"city": "Oslo"})
        assert rt.work(burst=True).outcomes == {"awaiting_approval": 1}
        assert counters.model == {"start": 1, "lookup": 1}
        assert counters.sent == []
        pending = rt.pending(run_id)
        assert pending.calls == [PendingCall(name="send_email", arguments=MAIL, id="c2")]
        assert rt.approve(run_id, by="alice", digest=pending.digest).outcome is Outcome.REQUEUED
        assert rt.work(burst=True).outcomes == {"completed": 1}
        assert counters.model == {"start": 1, "lookup": 1, "send_email": 1}
        assert counters.sent == [MAIL]
        recorded = steps(rt, run_id)
        assert [(s.kind, s.name) for s in recorded] == [
            ("llm", "mailer.model"),
            ("tool", "lookup"),
            ("llm", "mailer.model"),
            ("decision", "approval"),
            ("tool", "send_email"),
            ("llm", "mailer.model"),
        ]
        assert [s.tokens for s in recorded if s.kind == "llm"] == [20, 20, 20]
        row = rt.get(run_id)
        assert row.status is RunStatus.COMPLETED
        assert row.state.tokens == 60
        trail = [type(h.event).__name__ for h in rt.history(run_id)]
        assert trail.count("EffectPending") == 1
        assert row.state.pending_effects == ()
    finally:
        rt.close()


def test_openai_agents__approval_is_bound_to_the_exact_arguments(db_url: str) -> None:
    """An approval quoting the digest of other arguments (another recipient) is refused and
    changes nothing; only the digest of the exact pending call resumes the run."""
    counters = Counters()
    rt = make_runtime(db_url, app=mailer_app(counters))
    try:
        run_id = rt.enqueue("mailer", {"city": "Oslo"})
        rt.work(burst=True)
        changed = [PendingCall(name="send_email", arguments={**MAIL, "to": "b@x.org"}, id="c2")]
        with pytest.raises(DigestMismatch):
            rt.approve(run_id, by="mallory", digest=calls_digest(changed))
        assert rt.get(run_id).status is RunStatus.WAITING_FOR_APPROVAL
        exact = [PendingCall(name="send_email", arguments=MAIL, id="c2")]
        assert rt.pending(run_id).digest == calls_digest(exact)
        rt.approve(run_id, by="alice", digest=calls_digest(exact))
        rt.work(burst=True)
        assert counters.sent == [MAIL]
    finally:
        rt.close()


def test_openai_agents__denial_reaches_the_model_as_the_tools_output(db_url: str) -> None:
    """A denied call never runs; the model receives the SDK's rejection as the tool's
    output, "denied by the operator", and the run completes without a marker."""
    counters = Counters()
    rt = make_runtime(db_url, app=mailer_app(counters))
    try:
        run_id = rt.enqueue("mailer", {"city": "Oslo"})
        rt.work(burst=True)
        rt.deny(run_id, by="bob", digest=rt.pending(run_id).digest)
        rt.work(burst=True)
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert counters.sent == []
        assert counters.seen[-1] == "denied by the operator"
        assert not any(isinstance(h.event, Run.EffectPending) for h in rt.history(run_id))
    finally:
        rt.close()


def test_openai_agents__outside_a_steptrail_run_refuses_loudly(runtime: Runtime) -> None:
    """`run` refuses outside an async steptrail agent (also inside a synchronous one), and
    an agent with handoffs is refused rather than run without durability."""
    agent = mailer_agent(Counters())
    with pytest.raises(NotInSteptrailRun):
        asyncio.run(openai_agents.run(agent, "hello"))

    app = steptrail.App()

    @app.agent("sync_host")
    def sync_host(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {"output": asyncio.run(openai_agents.run(agent, "hello")).final_output}

    @app.agent("with_handoffs")
    async def with_handoffs(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        other = Agent(name="other")
        await openai_agents.run(agent.clone(handoffs=[other]), "hello")
        return {}

    runtime.app.include(app)
    for name, error in (
        ("sync_host", "NotInSteptrailRun"),
        ("with_handoffs", "NotImplementedError"),
    ):
        run_id = runtime.enqueue(name, {})
        runtime.work(burst=True)
        assert runtime.get(run_id).status is RunStatus.FAILED
        assert runtime.history(run_id)[-1].event.error_type == error  # type: ignore[attr-defined]
