"""OpenTelemetry traces of runs: a span per segment and per step, one trace per run.

Install `steptrail[otel]` (the OpenTelemetry API only) and configure an SDK in your process as
you would for any instrumented library; without an SDK the API hands out non-recording spans
and nothing is exported. steptrail never installs a tracer provider itself (ADR 0031).

One trace per run: creating a run (`enqueue`, `start`) opens a short span under the caller's
current context and saves its W3C `traceparent` in the run's creation event. Every segment
of the run (first claim, retries, reclaims, resumes after a decision, on any worker) starts
its `invoke_agent` span from that saved context, and each step is a child of its segment.
The segment's and the step's spans are the current span while the agent and the step run,
so spans of the libraries the agent calls (HTTP clients, model SDKs) nest under the step.

Attributes follow the privacy level exactly as the log does: a step's attributes come from
its record as written (payload after the privacy filter, error class never its message), so
at `none` and `metadata` no content reaches a span. Exceptions are not recorded as span
events (they would carry the message); `error.type` names the class.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TracerProvider,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from steptrail.domain.enums import Outcome, Segment
from steptrail.domain.run import Run
from steptrail.workers.telemetry import (
    NO_STEP,
    CreationProbe,
    SegmentProbe,
    StepEnd,
    StepProbe,
    Telemetry,
)

__all__ = ["Tracing"]

PROPAGATOR = TraceContextTextMapPropagator()
INSTRUMENTATION = "steptrail"
# Outcomes that end a segment in error (a requeue is an error the run recovers from).
ERROR_OUTCOMES = frozenset(
    {Outcome.FAILED, Outcome.LEASE_LOST, Outcome.SUSPEND_FAILED, Outcome.REQUEUED}
)
MAX_PAYLOAD_ATTRIBUTE = 4_096
# GenAI semantic-convention operation of a step kind (others are steptrail's own).
OPERATIONS = {"tool": "execute_tool", "llm": "chat"}
# Keys of a model call's recorded payload that become GenAI attributes (`_genai_llm`).
GENAI_KEYS = frozenset({"model", "provider", "input_tokens", "output_tokens", "finish_reason"})


class Tracing(Telemetry):
    """Spans of runs, segments and steps through the OpenTelemetry API.

    Args:
        tracer_provider: the provider to take the tracer from (default: the global one,
            i.e. whatever SDK the application configured, or none).
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer(INSTRUMENTATION, _version(), tracer_provider=tracer_provider)

    def run_created(self, *, agent: str, run_id: UUID, how: str) -> CreationProbe:
        kind = SpanKind.PRODUCER if how == "enqueue" else SpanKind.INTERNAL
        span = self.tracer.start_span(
            f"{how} {agent}",
            kind=kind,
            attributes={"steptrail.run.id": str(run_id), "gen_ai.agent.name": agent},
        )
        return _Creation(span)

    def segment_started(self, run: Run) -> SegmentProbe:
        state = run.state
        parent = _parent_context(state.trace_parent)
        span = self.tracer.start_span(
            f"invoke_agent {state.agent}",
            context=parent,
            kind=SpanKind.CONSUMER if state.segment is Segment.WORKER else SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": state.agent,
                "steptrail.run.id": str(state.run_id),
                "steptrail.run.attempt": state.requeue_count + 1,
                "steptrail.segment.kind": state.segment.value if state.segment else "",
                "steptrail.worker.id": state.holder or "",
            },
        )
        return _SegmentSpan(self.tracer, span)


class _Creation(CreationProbe):
    def __init__(self, span: Span) -> None:
        self.span = span
        carrier: dict[str, str] = {}
        if span.get_span_context().is_valid:
            PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        self._parent = carrier.get("traceparent")

    @property
    def trace_parent(self) -> str | None:
        return self._parent

    def ended(self, *, duplicate: bool = False) -> None:
        if duplicate:
            self.span.set_attribute("steptrail.run.duplicate", True)
        self.span.end()


class _StepSpan(StepProbe):
    def __init__(self, span: Span, kind: str, name: str, segment: otel_context.Context) -> None:
        self.span = span
        self.kind = kind
        self.name = name
        self.context = trace.set_span_in_context(span, segment)
        self.closed = False

    def activate(self) -> Callable[[], None]:
        # Current while the step runs, so the spans of what it calls nest under it.
        token = otel_context.attach(self.context)
        return lambda: otel_context.detach(token)

    def ended(self, end: StepEnd) -> None:
        span = self.span
        if not span.is_recording():
            return
        payload = end.payload
        if (
            end.error_type is None
            and not end.tokens
            and not end.cost
            and (
                not payload or (payload.get("content_redacted") and GENAI_KEYS.isdisjoint(payload))
            )
        ):
            # The common no-content step: one attribute. `set_attribute` skips the SDK's
            # mapping checks that `set_attributes` pays per call (ADR 0045).
            span.set_attribute("steptrail.step.outcome", "ok")
            return
        # One call, one lock: the SDK cleans every attribute value it is given, so the
        # per-step cost is in how many there are (bench/observability.py).
        attributes: dict[str, Any] = {
            "steptrail.step.outcome": "ok" if end.error_type is None else "error"
        }
        if end.tokens:
            attributes["steptrail.step.tokens"] = end.tokens
        if end.cost:
            attributes["steptrail.step.cost"] = end.cost
        # Below `redacted` the filter left counts and lengths only (and says so): nothing
        # worth a JSON attribute per step. Above, the payload is what the log holds.
        if payload and not payload.get("content_redacted"):
            attributes["steptrail.step.payload"] = _json(payload)
        if self.kind == "llm":
            model = _genai_llm(attributes, payload)
            if model is not None:
                span.update_name(f"chat {model}")
        if end.error_type is not None:
            attributes["error.type"] = end.error_type
            if end.failure_class is not None:
                attributes["steptrail.failure_class"] = end.failure_class
            span.set_status(Status(StatusCode.ERROR, end.failure_class or end.error_type))
        span.set_attributes(attributes)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.span.end()


class _SegmentSpan(SegmentProbe):
    def __init__(self, tracer: trace.Tracer, span: Span) -> None:
        self.tracer = tracer
        self.span = span
        self.replayed = 0
        self.failure: tuple[str, str] | None = None
        self.cause: str | None = None
        self.open_step: _StepSpan | None = None
        self.recording = span.is_recording()
        self.context = trace.set_span_in_context(span)

    def activate(self) -> Callable[[], None]:
        # Current while the agent runs: its own spans and outgoing calls join the trace.
        token = otel_context.attach(self.context)
        return lambda: otel_context.detach(token)

    def _step_span(self, kind: str, name: str, seq: int, *, replayed: bool) -> Span:
        # The SDK cleans every attribute it is given (about as much CPU per attribute as a
        # tenth of the span itself): the run's id and attempt are on the segment, the
        # step's parent, and are not repeated here (ADR 0045).
        operation = OPERATIONS.get(kind)
        attributes: dict[str, Any] = {
            "steptrail.step.kind": kind,
            "steptrail.step.name": name,
            "steptrail.step.seq": seq,
            "steptrail.step.replayed": replayed,
        }
        if operation is not None:
            attributes["gen_ai.operation.name"] = operation
            if kind == "tool":
                attributes["gen_ai.tool.name"] = name
        return self.tracer.start_span(
            f"{operation or kind} {name}", context=self.context, attributes=attributes
        )

    def step_started(self, kind: str, name: str, seq: int) -> StepProbe:
        if not self.recording:
            # No SDK, or the trace was sampled out: its step spans would not record either.
            # The segment's context stays current, so propagation to outside calls works.
            return NO_STEP
        step = _StepSpan(self._step_span(kind, name, seq, replayed=False), kind, name, self.context)
        self.open_step = step
        return step

    def step_replayed(self, kind: str, name: str, seq: int, *, failed: bool) -> None:
        self.replayed += 1
        if not self.recording:
            return
        span = self._step_span(kind, name, seq, replayed=True)
        span.set_attribute("steptrail.step.outcome", "error" if failed else "ok")
        span.end()

    def lease_renewed(self) -> None:
        self.span.add_event("lease_renewed")

    def lease_lost(self, cause: str) -> None:
        self.cause = cause
        self.span.add_event("lease_lost", {"steptrail.lease_lost.cause": cause})

    def failed(self, failure_class: str, error_type: str) -> None:
        self.failure = (failure_class, error_type)

    def ended(self, outcome: Outcome | None) -> None:
        if self.open_step is not None:
            self.open_step.close()  # a step that never reached its record (lost, interrupted)
        span = self.span
        if span.is_recording():
            name = outcome.value if outcome is not None else "crashed"
            if not self.replayed and self.cause is None and self.failure is None:
                span.set_attribute("steptrail.outcome", name)  # the common case: one value
                if outcome is None or outcome in ERROR_OUTCOMES:
                    span.set_status(Status(StatusCode.ERROR, name))
                span.end()
                return
            attributes: dict[str, Any] = {"steptrail.outcome": name}
            if self.replayed:
                attributes["steptrail.steps.replayed"] = self.replayed
            if self.cause is not None:
                attributes["steptrail.lease_lost.cause"] = self.cause
            if self.failure is not None:
                attributes["steptrail.failure_class"] = self.failure[0]
                attributes["error.type"] = self.failure[1]
            span.set_attributes(attributes)
            if outcome is None or outcome in ERROR_OUTCOMES:
                span.set_status(Status(StatusCode.ERROR, name))
        span.end()


def _genai_llm(attributes: dict[str, Any], payload: Mapping[str, Any]) -> str | None:
    """Add the GenAI semantic-convention attributes a model call's recorded (filtered)
    payload supports; returns the model name if one was recorded."""
    if not payload:
        return None
    model = payload.get("model")
    if isinstance(model, str):
        attributes["gen_ai.request.model"] = model
    provider = payload.get("provider")
    if isinstance(provider, str):
        attributes["gen_ai.provider.name"] = provider
    for key in ("input_tokens", "output_tokens"):
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            attributes[f"gen_ai.usage.{key}"] = value
    reason = payload.get("finish_reason")
    if isinstance(reason, str):
        attributes["gen_ai.response.finish_reasons"] = [reason]
    return model if isinstance(model, str) else None


def _parent_context(trace_parent: str | None) -> otel_context.Context | None:
    """The context a saved `traceparent` describes (None: continue from the current one).

    Parsed here rather than by the propagator: this runs for every segment, and the saved
    value was written by `_Creation` in the one W3C format.
    """
    if trace_parent is None:
        return None
    parts = trace_parent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id:
        return None
    parent = SpanContext(trace_id, span_id, True, TraceFlags(flags))
    return trace.set_span_in_context(NonRecordingSpan(parent))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("steptrail")
    except PackageNotFoundError:
        return "unknown"


def _json(value: Any) -> str:
    text = json.dumps(value, default=str, sort_keys=True)
    if len(text) > MAX_PAYLOAD_ATTRIBUTE:
        return text[:MAX_PAYLOAD_ATTRIBUTE] + "…"
    return text
