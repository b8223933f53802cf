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
* `crash`: `{"at": k, "times": n}`: kill this whole process with SIGKILL in the middle of
  step k, like a machine dying (for trying the reaper; never in a process you care about).
* `approval`: `{"at": k or [k, …], "tools": ["send_email", …]}`: before step k, stop and
  wait for a person to approve those tool calls (`steptrail approve/deny`); when resumed,
  run them (or record their denial) and go on. Several points suspend several times.
* `input`: `{"at": k, "schema": <JSON Schema>, "prompt": "…"}`: before step k, wait for input
  (`steptrail input RUN --values '{…}'`).
* `result`: what the run returns when it completes.
* `witness`: a folder; every real execution of step k (not a replay) appends a line `k` to
  `<witness>/<run id>`, so a test can count executions from outside the database.
* `hang`: `{"at": k, "seconds": s, "times": n}`: step k sleeps `s` seconds on the first n
  executions (for trying step deadlines); `timeout`: every step's deadline in seconds.

Steps are durable (ADR 0013): when the run is retried, reclaimed or resumed, the steps it
already recorded are replayed from the journal and the scripted work for them does not run
again; an approval or input point returns the decision on the resumed segment.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from steptrail.domain.classifier import ClassifiedError, HttpStatusError
from steptrail.domain.enums import Effect, FailureClass
from steptrail.domain.schemas import InvalidSchema, check_schema
from steptrail.workers.registry import App

if TYPE_CHECKING:  # the agent's context is imported when it runs (ADR 0051)
    from steptrail.workers.context import RunContext

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


class HangScript(_Strict):
    at: int = Field(default=1, ge=1)
    seconds: float = Field(default=60.0, gt=0, le=3600)
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
    witness: str | None = None
    hang: HangScript | None = None
    timeout: float | None = Field(default=None, gt=0, le=3600)


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
    """Record `steps` steps, with the tool call, failure, crash or pause the request scripts."""
    from steptrail.workers.context import Recorded  # loaded already: this runs in a segment

    script = Script.model_validate(request)
    pauses = sorted(
        [(k, "approval") for k in (script.approval.at if script.approval else [])]
        + ([(script.input.at, "input")] if script.input else [])
    )
    total = max([script.steps, script.tool.at if script.tool else 0, *(k for k, _ in pauses)])
    for k in range(1, total + 1):
        for at, kind in pauses:
            if at == k:
                _pause(ctx, script, kind, k)
        work = _work(ctx, script, k)
        if script.fail and k == script.fail.at and _due(script.fail.times, ctx.attempt):
            failure = error_of(script.fail.class_)
            ctx.step("llm", f"think-{k}", _raiser(work, failure), timeout=script.timeout)
        if script.tool and k == script.tool.at:
            name = script.tool.name or TOOLS[script.tool.effect]
            result = {"tool": name, "ok": True, "key": f"{ctx.fencing_token}:{k}"}
            ctx.tool(name, _doer(work, result), arguments={"step": k}, timeout=script.timeout)
            continue
        ctx.llm(
            f"think-{k}",
            _doer(work, Recorded(f"thought {k}", tokens=10, cost=0.0001)),
            payload={"messages": [{"role": "user", "content": f"step {k}"}], "round": k},
            timeout=script.timeout,
        )
    return script.result or {"steps": total}


def _pause(ctx: RunContext, script: Script, kind: str, k: int) -> None:
    """Wait for a person at step k; on the resumed segment, act on the decision: approved
    calls run as tools, denied ones get their error result, input is used in a step."""
    if kind == "approval":
        assert script.approval is not None
        calls = [{"name": t, "arguments": {"step": k}} for t in script.approval.tools]
        ctx.request_approval(calls, conversation={"at": k})
        ctx.run_pending(lambda call: {"tool": call.name, "ok": True})
        return
    assert script.input is not None
    values = ctx.request_input(
        script.input.schema_, prompt=script.input.prompt, conversation={"at": k}
    )
    ctx.step("input", "use-input", lambda: sorted(values))


def _work(ctx: RunContext, script: Script, k: int) -> Any:
    """What step k really does when it executes: note it for a witness, then take its time."""
    attempt = ctx.attempt
    witness = Path(script.witness) / str(ctx.run_id) if script.witness else None
    hang = script.hang if script.hang and script.hang.at == k else None
    crash = script.crash if script.crash and script.crash.at == k else None

    def run() -> None:
        if witness is not None:
            with witness.open("a") as f:
                f.write(f"{k}\n")
        if crash is not None and _due(crash.times, attempt):
            # In the middle of step k: the records of steps 1..k-1 are in the log.
            os.kill(os.getpid(), signal.SIGKILL)
        if hang is not None and _due(hang.times, attempt):
            time.sleep(hang.seconds)
        elif script.sleep:
            time.sleep(script.sleep)

    return run


def _doer(work: Any, value: Any) -> Any:
    def run() -> Any:
        work()
        return value

    return run


def _raiser(work: Any, error: Exception) -> Any:
    def run() -> Any:
        work()
        raise error

    return run
