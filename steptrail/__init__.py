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

from steptrail.async_runtime import AsyncRuntime, open_async
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
from steptrail.runtime import InvalidItem, InvalidRequest, RetryReport, Runtime, open_runtime
from steptrail.workers.async_context import AsyncRunContext
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
from steptrail.workers.segment import LeaseLost

open = open_runtime

__all__ = [
    "App",
    "AsyncRunContext",
    "AsyncRuntime",
    "AwaitableAgent",
    "AwaitableInSyncStep",
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
    "InvalidRequest",
    "LeaseLost",
    "LoopAlreadyRunning",
    "NonDeterministic",
    "Outcome",
    "PendingWrite",
    "PrivacyLevel",
    "Projection",
    "ProjectionFailed",
    "ReapReport",
    "Recorded",
    "RecordedEvent",
    "ReplayedError",
    "Resumption",
    "RetryReport",
    "RunContext",
    "RunFailed",
    "RunRow",
    "RunStatus",
    "RunTimedOut",
    "Runtime",
    "SegmentResult",
    "Settings",
    "Sql",
    "StepTimedOut",
    "StoreUnavailable",
    "TerminationReason",
    "Tracking",
    "UnknownAgent",
    "UnknownRun",
    "format_position",
    "open",
    "open_async",
    "open_runtime",
    "parse_position",
]
