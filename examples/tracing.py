"""Each run is one trace: configure an OpenTelemetry SDK, enqueue inside your own span.

python -m examples.tracing      # needs opentelemetry-sdk (in the test extra)
"""

from __future__ import annotations

import steptrail

app = steptrail.App()


@app.agent("triage")
def triage(ctx: steptrail.RunContext, request: dict) -> dict:
    return {"plan": ctx.llm("plan", lambda: f"plan for {request['ticket']}")}


if __name__ == "__main__":
    # --8<-- [start:setup]
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()  # in production: OTLPSpanExporter() and a batch processor
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # or steptrail.open(app, tracer_provider=provider)

    tracer = trace.get_tracer("myapp")
    with steptrail.open(app) as rt:
        with tracer.start_as_current_span("POST /tickets"):
            run_id = rt.enqueue("triage", {"ticket": "T-1"})  # the run joins this trace
        rt.work(burst=True)
        print(rt.get(run_id).status, sorted(span.name for span in exporter.get_finished_spans()))
    # --8<-- [end:setup]
