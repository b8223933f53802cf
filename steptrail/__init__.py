"""steptrail: event-sourced durable runs for LLM agents.

import steptrail

app = steptrail.App()

@app.agent("summarise")
def summarise(ctx: steptrail.RunContext, request: dict) -> dict:
    text = ctx.llm("draft", lambda: call_model(request["text"]))
    return {"summary": text}

with steptrail.open(app) as rt:          # sqlite:///steptrail.db unless configured
    run_id = rt.enqueue("summarise", {"text": "..."})
    rt.work(burst=True)
    print(rt.get(run_id).status)

Async agents (`async def`, with an `AsyncRunContext` whose steps are awaited) run on the
worker's event loop; from async code, `async with steptrail.open_async(app) as rt:`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from steptrail.async_runtime import AsyncRuntime, open_async
    from steptrail.domain.children import ChildFailed
    from steptrail.domain.classifier import (
        ClassifiedError,
        FallbackChainExhausted,
        HttpStatusError,
    )
    from steptrail.domain.enums import (
        Effect,
        FailureClass,
        Outcome,
        PrivacyLevel,
        RetryMode,
        RunStatus,
        TerminationReason,
    )
    from steptrail.domain.errors import (
        DigestMismatch,
        IllegalTransition,
        InvalidInput,
        PendingWrite,
        StoreUnavailable,
        UnknownRun,
    )
    from steptrail.domain.journal import NonDeterministic, ReplayedError
    from steptrail.domain.ports import RecordedEvent
    from steptrail.domain.rate_limits import InvalidRateLimit, RateLimited, UnknownRateLimit
    from steptrail.domain.retry_plan import InvalidRetryPosition, RetryPlan
    from steptrail.infrastructure.feed import FeedEntry, format_position, parse_position
    from steptrail.infrastructure.settings import Settings
    from steptrail.projections.custom import (
        EventContext,
        Projection,
        ProjectionFailed,
        Sql,
        Tracking,
    )
    from steptrail.projections.run_index import RunRow
    from steptrail.runtime import InvalidItem, InvalidRequest, Runtime, open_runtime
    from steptrail.workers.async_context import AsyncRunContext
    from steptrail.workers.children import ChildHandle
    from steptrail.workers.context import (
        AwaitableInSyncStep,
        Recorded,
        Resumption,
        RunContext,
        RunFailed,
        RunTimedOut,
        StepTimedOut,
    )
    from steptrail.workers.execute import AwaitableAgent, LoopAlreadyRunning, SegmentResult
    from steptrail.workers.reaper import ReapReport
    from steptrail.workers.registry import App, UnknownAgent
    from steptrail.workers.retries import AlreadyRetried, RetryReport
    from steptrail.workers.segment import LeaseLost
    from steptrail.workers.signals import SignalSent
    from steptrail.workers.waits import WaitTimedOut

    open = open_runtime

# Every public name and the module it lives in: importing `steptrail` imports none of them,
# so a command line that needs three of them does not pay for the runtime, PostgreSQL's
# driver, structlog and pydantic-ai's seams (ADR 0043). `from steptrail import X` and
# `steptrail.X` import X's module on first use (PEP 562).
_WHERE: dict[str, str] = {
    "AlreadyRetried": "steptrail.workers.retries",
    "App": "steptrail.workers.registry",
    "ChildFailed": "steptrail.domain.children",
    "ChildHandle": "steptrail.workers.children",
    "AsyncRunContext": "steptrail.workers.async_context",
    "AsyncRuntime": "steptrail.async_runtime",
    "AwaitableAgent": "steptrail.workers.execute",
    "AwaitableInSyncStep": "steptrail.workers.context",
    "ClassifiedError": "steptrail.domain.classifier",
    "DigestMismatch": "steptrail.domain.errors",
    "Effect": "steptrail.domain.enums",
    "EventContext": "steptrail.projections.custom",
    "FailureClass": "steptrail.domain.enums",
    "FallbackChainExhausted": "steptrail.domain.classifier",
    "FeedEntry": "steptrail.infrastructure.feed",
    "HttpStatusError": "steptrail.domain.classifier",
    "IllegalTransition": "steptrail.domain.errors",
    "InvalidInput": "steptrail.domain.errors",
    "InvalidItem": "steptrail.runtime",
    "InvalidRateLimit": "steptrail.domain.rate_limits",
    "InvalidRequest": "steptrail.runtime",
    "InvalidRetryPosition": "steptrail.domain.retry_plan",
    "LeaseLost": "steptrail.workers.segment",
    "LoopAlreadyRunning": "steptrail.workers.execute",
    "NonDeterministic": "steptrail.domain.journal",
    "Outcome": "steptrail.domain.enums",
    "PendingWrite": "steptrail.domain.errors",
    "PrivacyLevel": "steptrail.domain.enums",
    "Projection": "steptrail.projections.custom",
    "ProjectionFailed": "steptrail.projections.custom",
    "RateLimited": "steptrail.domain.rate_limits",
    "ReapReport": "steptrail.workers.reaper",
    "Recorded": "steptrail.workers.context",
    "RecordedEvent": "steptrail.domain.ports",
    "ReplayedError": "steptrail.domain.journal",
    "Resumption": "steptrail.workers.context",
    "RetryMode": "steptrail.domain.enums",
    "RetryPlan": "steptrail.domain.retry_plan",
    "RetryReport": "steptrail.workers.retries",
    "RunContext": "steptrail.workers.context",
    "RunFailed": "steptrail.workers.context",
    "RunRow": "steptrail.projections.run_index",
    "RunStatus": "steptrail.domain.enums",
    "RunTimedOut": "steptrail.workers.context",
    "Runtime": "steptrail.runtime",
    "SegmentResult": "steptrail.workers.execute",
    "Settings": "steptrail.infrastructure.settings",
    "SignalSent": "steptrail.workers.signals",
    "Sql": "steptrail.projections.custom",
    "StepTimedOut": "steptrail.workers.context",
    "StoreUnavailable": "steptrail.domain.errors",
    "TerminationReason": "steptrail.domain.enums",
    "Tracking": "steptrail.projections.custom",
    "UnknownAgent": "steptrail.workers.registry",
    "UnknownRateLimit": "steptrail.domain.rate_limits",
    "UnknownRun": "steptrail.domain.errors",
    "WaitTimedOut": "steptrail.workers.waits",
    "format_position": "steptrail.infrastructure.feed",
    "open_async": "steptrail.async_runtime",
    "open_runtime": "steptrail.runtime",
    "parse_position": "steptrail.infrastructure.feed",
    "open": "steptrail.runtime",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'steptrail' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), "open_runtime" if name == "open" else name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AlreadyRetried",
    "App",
    "AsyncRunContext",
    "AsyncRuntime",
    "AwaitableAgent",
    "AwaitableInSyncStep",
    "ChildFailed",
    "ChildHandle",
    "ClassifiedError",
    "DigestMismatch",
    "Effect",
    "EventContext",
    "FailureClass",
    "FallbackChainExhausted",
    "FeedEntry",
    "HttpStatusError",
    "IllegalTransition",
    "InvalidInput",
    "InvalidItem",
    "InvalidRateLimit",
    "InvalidRequest",
    "InvalidRetryPosition",
    "LeaseLost",
    "LoopAlreadyRunning",
    "NonDeterministic",
    "Outcome",
    "PendingWrite",
    "PrivacyLevel",
    "Projection",
    "ProjectionFailed",
    "RateLimited",
    "ReapReport",
    "Recorded",
    "RecordedEvent",
    "ReplayedError",
    "Resumption",
    "RetryMode",
    "RetryPlan",
    "RetryReport",
    "RunContext",
    "RunFailed",
    "RunRow",
    "RunStatus",
    "RunTimedOut",
    "Runtime",
    "SegmentResult",
    "Settings",
    "SignalSent",
    "Sql",
    "StepTimedOut",
    "StoreUnavailable",
    "TerminationReason",
    "Tracking",
    "UnknownAgent",
    "UnknownRateLimit",
    "UnknownRun",
    "WaitTimedOut",
    "format_position",
    "open",
    "open_async",
    "open_runtime",
    "parse_position",
]
