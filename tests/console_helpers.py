"""Shared by the console's integration and browser tests: runs in every state an operator
acts on, and a hostile agent whose name and payloads try to inject markup."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from steptrail import App, RunContext
from steptrail.domain.enums import RunStatus
from steptrail.runtime import Runtime

HOSTILE = "<script>alert('x')</script>\"'><img src=x onerror=alert(1)>"
APPROVAL = {"steps": 3, "approval": {"at": 2, "tools": ["send_email"]}}
INPUT = {
    "steps": 2,
    "input": {
        "at": 1,
        "schema": {
            "type": "object",
            "properties": {
                "account": {"type": "string", "minLength": 1, "title": "Account"},
                "seats": {"type": "integer", "minimum": 1},
                "plan": {"type": "string", "enum": ["basic", "pro"]},
            },
            "required": ["account", "seats"],
        },
        "prompt": "Which account, how many seats?",
    },
}
DEAD = {"steps": 2, "fail": {"class": "auth", "at": 1, "times": 1}}


def hostile_app() -> App:
    """An agent whose name, step name and payload are markup and quotes."""
    app = App()

    @app.agent(HOSTILE, privacy="full")
    def hostile(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.step("llm", HOSTILE, lambda: {"text": HOSTILE}, payload={"content": HOSTILE})
        return {"answer": HOSTILE}

    return app


def caught_up(rt: Runtime, timeout: float = 20.0) -> None:
    """Project until every run's summary is at its index version. On PostgreSQL the views
    only read transactions older than every one still open on the server (ADR 0012), so one
    `project()` may stop short while other sessions' transactions are open."""
    deadline = time.monotonic() + timeout
    while True:
        rt.project()
        rows = rt.store.all_rows()
        behind = [
            r
            for r in rows
            if (s := rt.views.summary(r.run_id)) is None or s.state.version != r.state.version
        ]
        if not behind:
            return
        assert time.monotonic() < deadline, f"{len(behind)} run(s) never reached the views"
        time.sleep(0.05)


def settle(rt: Runtime, request: dict[str, Any], agent: str = "scripted") -> UUID:
    """Enqueue a run and work the queue until nothing is ready; views caught up."""
    run_id = rt.enqueue(agent, request)
    rt.work(burst=True)
    caught_up(rt)
    return run_id


def topics(rt: Runtime, run_id: UUID) -> list[str]:
    return [type(h.event).__name__ for h in rt.history(run_id)]


def status(rt: Runtime, run_id: UUID) -> RunStatus:
    return rt.get(run_id).status
