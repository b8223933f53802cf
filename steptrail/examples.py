"""The built-in scripted agent: its request scripts what it does, so steptrail can be tried
(and tested) with no agent code at all.

    steptrail enqueue scripted --request '{"steps": 3, "sleep": 0.2}'
    steptrail enqueue scripted -r '{"steps": 4, "fail": {"class": "server_error", "at": 2}}'
    steptrail enqueue scripted -r '{"steps": 2, "tool": {"effect": "idempotent_write"}}'

Request fields (all optional):

* `steps` (default 1): how many model-call steps to record; `sleep` seconds each (default 0).
* `tool`: `{"effect": "read_only" | "idempotent_write" | "non_idempotent_write", "at": k,
  "name": optional}`: call a tool with that declared effect as step k (the built-in tools are
  `lookup`, `upsert_record` and `send_email`; any other name counts as undeclared).
* `fail`: `{"class": <failure class>, "at": k, "times": n}`: raise an error of that class at
  step k on the first n executions (default: every execution).
* `crash`: `{"at": k, "times": n}`: kill this whole process with SIGKILL at step k, like a
  machine dying (for trying the reaper; never in a process you care about).
* `approval`: `{"at": k or [k, …], "tools": ["send_email", …]}`: before step k, stop and
  wait for a person to approve those tool calls (`steptrail approve/deny`); when resumed,
  run them (or record their denial) and go on. Several points suspend several times.
* `input`: `{"at": k, "schema": <JSON Schema>, "prompt": "…"}`: before step k, wait for input
  (`steptrail input RUN --values '{…}'`).
* `result`: what the run returns when it completes.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from steptrail.domain.classifier import ClassifiedError, HttpStatusError
from steptrail.domain.enums import Effect, FailureClass
from steptrail.domain.schemas import InvalidSchema, check_schema
from steptrail.workers.context import Recorded, RunContext
from steptrail.workers.registry import App

app = App()

TOOLS = {
    Effect.READ_ONLY: "lookup",
    Effect.IDEMPOTENT_WRITE: "upsert_record",
    Effect.NON_IDEMPOTENT_WRITE: "send_email",
}
for _effect, _name in TOOLS.items():
    app.tool(_name, effect=_effect)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolScript(_Strict):
    effect: Effect = Effect.READ_ONLY
    at: int = Field(default=1, ge=1)
    name: str | None = None


class FailScript(_Strict):
    class_: FailureClass = Field(alias="class")
    at: int = Field(default=1, ge=1)
    times: int | None = Field(default=None, ge=1)


class CrashScript(_Strict):
    at: int = Field(default=1, ge=1)
    times: int | None = Field(default=None, ge=1)


class ApprovalScript(_Strict):
    at: list[int] = Field(default_factory=lambda: [1])
    tools: list[str] = Field(default_factory=lambda: ["send_email"], min_length=1)

    @field_validator("at", mode="before")
    @classmethod
    def _points(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) else value


class InputScript(_Strict):
    at: int = Field(default=1, ge=1)
    schema_: dict[str, Any] = Field(
        alias="schema",
        default_factory=lambda: {
            "type": "object",
            "properties": {"account": {"type": "string", "minLength": 1}},
            "required": ["account"],
        },
    )
    prompt: str | None = "Which account?"

    @field_validator("schema_")
    @classmethod
    def _declarable(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Refused at enqueue, not only when the run reaches this step (ADR 0020).
        try:
            return check_schema(value)
        except InvalidSchema as error:
            raise ValueError(str(error)) from None


class Script(_Strict):
    """What the scripted agent does (see the module docstring)."""

    steps: int = Field(default=1, ge=0, le=10_000)
    sleep: float = Field(default=0.0, ge=0, le=3600)
    tool: ToolScript | None = None
    fail: FailScript | None = None
    crash: CrashScript | None = None
    approval: ApprovalScript | None = None
    input: InputScript | None = None
    result: dict[str, Any] | None = None


def error_of(failure_class: FailureClass) -> Exception:
    """A realistic exception of each failure class."""
    if failure_class is FailureClass.CONNECTION:
        return ConnectionError("scripted: connection reset")
    if failure_class is FailureClass.RATE_LIMIT:
        return HttpStatusError(429)
    if failure_class is FailureClass.AUTH:
        return HttpStatusError(401)
    if failure_class is FailureClass.CLIENT_ERROR:
        return HttpStatusError(400)
    if failure_class is FailureClass.SERVER_ERROR:
        return HttpStatusError(503)
    if failure_class is FailureClass.UNKNOWN:
        return RuntimeError("scripted: unexpected")
    return ClassifiedError(failure_class, f"scripted: {failure_class}")


def _due(times: int | None, attempt: int) -> bool:
    return times is None or attempt <= times


@app.agent("scripted", request_model=Script)
def scripted(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    """Record `steps` steps, with the tool call, failure or crash the request scripts."""
    script = Script.model_validate(request)
    pauses = sorted(
        [(k, "approval") for k in (script.approval.at if script.approval else [])]
        + ([(script.input.at, "input")] if script.input else [])
    )
    total = max([script.steps, script.tool.at if script.tool else 0, *(k for k, _ in pauses)])
    resumed_at = _resume(ctx)
    for k in range(1, total + 1):
        if k < resumed_at:
            continue  # done before the run suspended
        for at, kind in pauses:
            if at == k and k != resumed_at:
                _pause(ctx, script, kind, k)
        if script.crash and k == script.crash.at and _due(script.crash.times, ctx.attempt):
            os.kill(os.getpid(), signal.SIGKILL)
        if script.fail and k == script.fail.at and _due(script.fail.times, ctx.attempt):
            failure = error_of(script.fail.class_)
            ctx.step("llm", f"think-{k}", _raiser(failure, script.sleep))
        if script.tool and k == script.tool.at:
            name = script.tool.name or TOOLS[script.tool.effect]
            ctx.tool(
                name,
                _sleeper(
                    {"tool": name, "ok": True, "key": f"{ctx.fencing_token}:{k}"}, script.sleep
                ),
                arguments={"step": k},
            )
            continue
        ctx.llm(
            f"think-{k}",
            _sleeper(Recorded(f"thought {k}", tokens=10, cost=0.0001), script.sleep),
            payload={"messages": [{"role": "user", "content": f"step {k}"}], "round": k},
        )
    return script.result or {"steps": total}


def _resume(ctx: RunContext) -> int:
    """The step a resumed run continues from (0 for a fresh one), after resolving what it
    waited for: approved calls run as tools, denied ones get their error result."""
    resumed = ctx.resumed
    if resumed is None:
        return 0
    if resumed.kind.value == "approval":
        ctx.run_pending(lambda call: {"tool": call.name, "ok": True})
    else:
        ctx.step("input", "use-input", lambda: sorted(resumed.values or {}))
    return int(resumed.conversation["at"])


def _pause(ctx: RunContext, script: Script, kind: str, k: int) -> None:
    if kind == "approval":
        assert script.approval is not None
        calls = [{"name": t, "arguments": {"step": k}} for t in script.approval.tools]
        ctx.request_approval(calls, conversation={"at": k})
    assert script.input is not None
    ctx.request_input(script.input.schema_, prompt=script.input.prompt, conversation={"at": k})


def _sleeper(value: Any, seconds: float) -> Any:
    def run() -> Any:
        if seconds:
            time.sleep(seconds)
        return value

    return run


def _raiser(error: Exception, seconds: float) -> Any:
    def run() -> Any:
        if seconds:
            time.sleep(seconds)
        raise error

    return run
