"""OpenTelemetry traces of runs, on both backends, read back with the SDK's in-memory exporter."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from steptrail import App, Outcome, Recorded, RunContext, RunStatus, Settings, open_runtime
from steptrail.runtime import Runtime
from tests.conftest import FAST

CANARY = "canary-5e1f0c"


class Gate:
    """Holds a step of the first attempt until the test has reclaimed its run."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def wait_on_first(self, ctx: RunContext) -> dict[str, int]:
        if ctx.attempt == 1:
            self.entered.set()
            assert self.release.wait(20)
        return {"attempt": ctx.attempt}


def traced_app(gate: Gate) -> App:
    app = App()
    app.tool("publish", effect="non_idempotent_write")  # declared: its name is metadata

    @app.agent("traced")
    def traced(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm(
            "plan",
            lambda: Recorded(
                {"text": f"{CANARY} plan"},
                payload={
                    "model": "test-model",
                    "provider": "test",
                    "input_tokens": 7,
                    "output_tokens": 3,
                    "messages": [{"role": "user", "content": request["question"]}],
                },
                tokens=10,
                cost=0.25,
            ),
        )
        ctx.step("work", "wait", lambda: gate.wait_on_first(ctx))
        ctx.request_approval(
            [{"name": "publish", "arguments": {"text": CANARY}}], conversation=[CANARY]
        )
        ctx.run_pending({"publish": lambda text: {"published": text}})
        return {"answer": CANARY}

    return app


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.release.set()


def open_traced(
    db_url: str, exporter: InMemorySpanExporter, gate: Gate, **overrides: Any
) -> tuple[Runtime, TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = Settings(**{**FAST, "lease_seconds": 30.0, **overrides, "database_url": db_url})
    return open_runtime(traced_app(gate), settings=settings, tracer_provider=provider), provider


def reclaimed_then_approved(rt: Runtime, gate: Gate, provider: TracerProvider) -> Any:
    """Enqueue under a caller's span; the first segment is reclaimed mid-step, the second
    suspends for approval, the third (resumed here after the approval) completes."""
    with provider.get_tracer("test").start_as_current_span("http request") as caller:
        run_id = rt.enqueue("traced", {"question": CANARY})
    results: list[Any] = []
    worker = rt.worker(concurrency=1, burst=True, on_result=results.append)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    assert gate.entered.wait(20)
    stale = rt.store.load(run_id)
    assert stale is not None
    stale.reclaim(actor="reaper:test")  # what the reaper does once the lease expired
    rt.store.append(stale)
    gate.release.set()
    thread.join(30)
    assert [r.outcome for r in results] == [Outcome.LEASE_LOST, Outcome.AWAITING_APPROVAL]
    resumed = rt.approve(run_id, by="ann", resume="here")
    assert resumed.outcome is Outcome.COMPLETED
    assert rt.get(run_id).status is RunStatus.COMPLETED
    return run_id, caller


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def by_start(spans: Any) -> list[ReadableSpan]:
    return sorted(spans, key=lambda s: s.start_time)


def test_trace__reclaimed_and_resumed_run_is_one_trace(
    db_url: str, exporter: InMemorySpanExporter, gate: Gate
) -> None:
    """A run reclaimed once and resumed after an approval is one trace: the caller's span,
    the enqueue span, three segment spans under it and their steps under them, in order."""
    rt, provider = open_traced(db_url, exporter, gate)
    try:
        run_id, caller = reclaimed_then_approved(rt, gate, provider)
    finally:
        rt.close()
    spans = exporter.get_finished_spans()
    trace_id = caller.get_span_context().trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}

    (enqueue,) = [s for s in spans if s.name == "enqueue traced"]
    assert enqueue.kind is SpanKind.PRODUCER
    assert enqueue.parent is not None
    assert enqueue.parent.span_id == caller.get_span_context().span_id

    segments = by_start(s for s in spans if s.name == "invoke_agent traced")
    assert [s.attributes["steptrail.outcome"] for s in segments] == [
        "lease_lost",
        "awaiting_approval",
        "completed",
    ]
    assert all(
        s.parent is not None and s.parent.span_id == enqueue.context.span_id for s in segments
    )
    assert [s.attributes["steptrail.run.attempt"] for s in segments] == [1, 2, 2]
    assert [s.attributes["steptrail.segment.kind"] for s in segments] == [
        "worker",
        "worker",
        "resume",
    ]
    assert [s.attributes.get("steptrail.steps.replayed") for s in segments] == [None, 1, 2]
    assert segments[0].attributes["steptrail.lease_lost.cause"] == "taken_over"
    assert segments[0].status.status_code is StatusCode.ERROR
    assert segments[2].status.status_code is not StatusCode.ERROR
    assert all(s.attributes["steptrail.run.id"] == str(run_id) for s in segments)
    assert all(s.attributes["gen_ai.agent.name"] == "traced" for s in segments)

    def steps_of(segment: ReadableSpan) -> list[tuple[str, int, bool]]:
        children = by_start(
            s for s in spans if s.parent is not None and s.parent.span_id == segment.context.span_id
        )
        return [
            (
                str(s.attributes["steptrail.step.name"]),
                int(s.attributes["steptrail.step.seq"]),  # type: ignore[arg-type]
                bool(s.attributes["steptrail.step.replayed"]),
            )
            for s in children
        ]

    assert steps_of(segments[0]) == [("plan", 1, False), ("wait", 2, False)]
    assert steps_of(segments[1]) == [("plan", 1, True), ("wait", 2, False)]
    assert steps_of(segments[2]) == [
        ("plan", 1, True),
        ("wait", 2, True),
        ("approval", 3, False),  # the decision taken, recorded as a step
        ("publish", 4, False),
    ]

    plan = next(s for s in spans if s.attributes.get("steptrail.step.name") == "plan")
    assert plan.name == "chat test-model"
    assert plan.attributes["gen_ai.operation.name"] == "chat"
    assert plan.attributes["gen_ai.request.model"] == "test-model"
    assert plan.attributes["gen_ai.provider.name"] == "test"
    assert plan.attributes["gen_ai.usage.input_tokens"] == 7
    assert plan.attributes["gen_ai.usage.output_tokens"] == 3
    assert plan.attributes["steptrail.step.tokens"] == 10
    assert plan.attributes["steptrail.step.cost"] == 0.25
    assert plan.attributes["steptrail.step.outcome"] == "ok"
    publish = next(s for s in spans if s.attributes.get("steptrail.step.name") == "publish")
    assert publish.name == "execute_tool publish"
    assert publish.attributes["gen_ai.tool.name"] == "publish"


def every_attribute(spans: Any) -> list[str]:
    texts = []
    for span in spans:
        texts.append(span.name)
        texts.extend(str(v) for v in span.attributes.values())
        for event in span.events:
            texts.append(event.name)
            texts.extend(str(v) for v in (event.attributes or {}).values())
        texts.append(str(span.status.description))
    return texts


@pytest.mark.parametrize("level", ["metadata", "none"])
def test_trace__no_content_in_any_attribute_below_redacted(
    db_url: str, exporter: InMemorySpanExporter, gate: Gate, level: str
) -> None:
    """At none and metadata privacy the canary planted in the request, messages, step
    results, tool arguments and the run's result reaches no span name or attribute."""
    rt, provider = open_traced(db_url, exporter, gate, privacy_level=level)
    try:
        reclaimed_then_approved(rt, gate, provider)
    finally:
        rt.close()
    spans = exporter.get_finished_spans()
    assert len(spans) >= 10
    assert not [t for t in every_attribute(spans) if CANARY in t]


def test_trace__full_privacy_lets_content_into_step_payloads(
    db_url: str, exporter: InMemorySpanExporter, gate: Gate
) -> None:
    """At full privacy the step payload attribute carries what the log carries, content too
    (so the canary test above is not vacuous)."""
    rt, provider = open_traced(db_url, exporter, gate, privacy_level="full")
    try:
        reclaimed_then_approved(rt, gate, provider)
    finally:
        rt.close()
    assert [t for t in every_attribute(exporter.get_finished_spans()) if CANARY in t]


def test_logs__every_run_event_has_the_documented_fields(
    db_url: str, exporter: InMemorySpanExporter
) -> None:
    """Every log event about a traced run carries event, run_id, worker_id, version and
    its trace_id; step events carry their seq (a plain run, a write tool, a retry that
    replays, an approval resumed by a worker)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = Settings(**{**FAST, "database_url": db_url})
    rt = open_runtime(settings=settings, tracer_provider=provider)
    capture = structlog.testing.LogCapture()
    # Our own logger, whatever the process-wide logging set-up is.
    rt.log = structlog.wrap_logger(
        None,
        processors=[capture],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
    )
    requests: list[dict[str, Any]] = [
        {"steps": 2},
        {"steps": 2, "tool": {"effect": "idempotent_write", "at": 2}},
        {"steps": 3, "fail": {"class": "server_error", "at": 3, "times": 1}},
        {"steps": 2, "approval": {"at": 2, "tools": ["lookup"]}},
    ]
    try:
        with provider.get_tracer("test").start_as_current_span("caller") as caller:
            run_ids = [rt.enqueue("scripted", r) for r in requests]
        for _ in range(100):
            rt.work(concurrency=2, burst=True)
            waiting = rt.runs(status="waiting_for_approval")
            for row in waiting:
                rt.approve(row.run_id, by="ann", resume="queue")
            if all(rt.get(r).status is RunStatus.COMPLETED for r in run_ids):
                break
            time.sleep(0.05)
        statuses = {rt.get(r).status for r in run_ids}
    finally:
        rt.close()
    assert statuses == {RunStatus.COMPLETED}
    trace_id = format(caller.get_span_context().trace_id, "032x")
    ours = [e for e in capture.entries if e.get("run_id") in {str(r) for r in run_ids}]
    names = {e["event"] for e in ours}
    assert names >= {
        "run_enqueued",
        "run_claimed",
        "step_recorded",
        "effect_pending",
        "run_requeued",
        "steps_replayed",
        "run_suspended",
        "run_completed",
        "segment_finished",
    }, names
    for event in ours:
        assert event["trace_id"] == trace_id, event
        assert isinstance(event["version"], int), event
        if event["event"] != "run_enqueued":
            assert event["worker_id"].startswith(("worker:", "resume:")), event
        if event["event"] in {"step_recorded", "effect_pending"}:
            assert isinstance(event["seq"], int), event


def test_trace__interactive_start_is_one_trace_under_the_caller(
    db_url: str, exporter: InMemorySpanExporter
) -> None:
    """An interactive `start` opens a `start` span under the caller's span; its segment
    (INTERNAL, kind interactive) and step continue the same trace."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rt = open_runtime(
        settings=Settings(**{**FAST, "database_url": db_url}), tracer_provider=provider
    )
    try:
        with provider.get_tracer("test").start_as_current_span("cli") as caller:
            result = rt.start("scripted", {"steps": 1})
    finally:
        rt.close()
    assert result.outcome is Outcome.COMPLETED
    spans = {s.name: s for s in exporter.get_finished_spans()}
    start, segment = spans["start scripted"], spans["invoke_agent scripted"]
    assert parent_id(start) == caller.get_span_context().span_id
    assert parent_id(segment) == start.context.span_id
    assert segment.kind is SpanKind.INTERNAL
    assert segment.attributes["steptrail.segment.kind"] == "interactive"
    assert segment.attributes["steptrail.outcome"] == "completed"  # the one-value end
    assert segment.attributes["steptrail.run.attempt"] == 1
    (step,) = [s for s in spans.values() if s.attributes.get("steptrail.step.kind") == "llm"]
    assert parent_id(step) == segment.context.span_id
    # A no-content step ends with its outcome only; the attempt is on its parent (ADR 0045).
    assert step.attributes["steptrail.step.outcome"] == "ok"
    assert step.attributes["steptrail.step.replayed"] is False
    assert "steptrail.run.attempt" not in step.attributes
    assert {s.context.trace_id for s in spans.values()} == {caller.get_span_context().trace_id}
