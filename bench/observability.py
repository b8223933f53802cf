"""What observability costs a worker: no-op drain rate with and without metrics and tracing.

Five modes drain blocks of no-op runs (the built-in `scripted` agent, one step) with one
in-process worker at concurrency C, on one database, mode after mode, the order rotating
every cycle:

* `none`: the runtime's telemetry replaced by the no-op seam (nothing observed at all);
* `metrics`: the worker metrics (Prometheus) only;
* `metrics+api`: metrics, and tracing through the OpenTelemetry API with no SDK configured
  (what `steptrail[otel]` costs an application that does not export traces);
* `metrics+sdk-10%`: metrics, and the SDK sampling one trace in ten (`ParentBased`), batch
  span processor, an exporter that drops every span;
* `metrics+sdk`: metrics, and the SDK recording every span, with a batch span processor and
  an exporter that drops every span (the "no-op exporter"): spans are created, filled, ended
  and queued as in production, nothing leaves the process.

Runs are enqueued with the mode's telemetry (so traced runs carry a traceparent and their
segments continue it) but only the drain is timed. The ratio of each mode's rate to `none`
is taken within a cycle (drains seconds apart, same load); the report gives the median over
cycles and the quartiles. CPU per run is the process's CPU time (all threads) per run.

    python bench/observability.py                       # SQLite, 9 cycles of 200 runs
    python bench/observability.py --pg postgresql://postgres@127.0.0.1:5432 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NoOpTracerProvider

from steptrail.domain.enums import Outcome
from steptrail.domain.ports import ClaimedRun
from steptrail.domain.run import Run
from steptrail.infrastructure.logging import configure_logging
from steptrail.infrastructure.settings import Settings
from steptrail.runtime import Runtime, open_runtime
from steptrail.tracing import Tracing
from steptrail.worker_metrics import WorkerMetrics
from steptrail.workers.telemetry import NO_TELEMETRY, StepEnd, Telemetry, compose

MODES = ("none", "metrics", "metrics+api", "metrics+sdk-10%", "metrics+sdk")


class DropSpans(SpanExporter):
    """An exporter that accepts every batch and sends it nowhere."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def observers() -> tuple[dict[str, Telemetry], TracerProvider, DropSpans]:
    """The telemetry of each mode (made once: a process keeps one for its life)."""
    exporter = DropSpans()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    sampled = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)))
    sampled.add_span_processor(BatchSpanProcessor(exporter))
    modes = {
        "none": NO_TELEMETRY,
        "metrics": WorkerMetrics(),
        # steptrail[otel] installed, no SDK configured: the API's non-recording spans.
        "metrics+api": compose(WorkerMetrics(), Tracing(NoOpTracerProvider())),
        # the SDK sampling one trace in ten (ParentBased: a run's spans follow its root).
        "metrics+sdk-10%": compose(WorkerMetrics(), Tracing(sampled)),
        # the SDK recording every span, batch processor, exporter that drops them.
        "metrics+sdk": compose(WorkerMetrics(), Tracing(provider)),
    }
    return modes, provider, exporter


def database(backend: str, pg: str, folder: Path) -> tuple[str, Any]:
    """A fresh database URL, and how to drop it afterwards."""
    if backend == "sqlite":
        path = folder / f"obs-{uuid.uuid4().hex[:8]}.db"
        return f"sqlite:///{path}", lambda: [
            p.unlink(missing_ok=True) for p in folder.glob(f"{path.name}*")
        ]
    import psycopg

    name = f"steptrail_bench_obs_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"{pg}/{name}", drop


def drain(rt: Runtime, telemetry: Telemetry, runs: int, concurrency: int) -> dict[str, float]:
    """Enqueue `runs` no-op runs observed by `telemetry`, then time draining them."""
    rt.telemetry = telemetry
    for _ in range(runs):
        rt.enqueue("scripted", {"steps": 1})
    worker = rt.worker(concurrency=concurrency, burst=True)
    started = time.perf_counter()
    cpu = time.process_time()
    report = worker.run()
    elapsed = time.perf_counter() - started
    cpu_used = time.process_time() - cpu
    assert report.outcomes["completed"] == runs, report.as_dict()
    return {"runs_per_s": runs / elapsed, "cpu_ms_per_run": cpu_used * 1000 / runs}


def bench(backend: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Blocks of runs drained mode after mode, the order rotating every cycle, so that each
    ratio compares drains seconds apart on the same database under the same load."""
    url, drop = database(backend, args.pg, folder)
    settings = Settings(database_url=url, log_level="warning", tracing="off", poll_interval=0.05)
    modes, provider, exporter = observers()
    cycles: list[dict[str, dict[str, float]]] = []
    try:
        with open_runtime(settings=settings) as rt:
            drain(rt, NO_TELEMETRY, args.block, args.concurrency)  # warm-up, not counted
            for cycle in range(args.cycles):
                shift = cycle % len(MODES)
                order = MODES[shift:] + MODES[:shift]
                cycles.append({m: drain(rt, modes[m], args.block, args.concurrency) for m in order})
                line = "  ".join(f"{m} {cycles[-1][m]['runs_per_s']:6.0f}/s" for m in MODES)
                print(f"{backend} cycle {cycle + 1}: {line}", file=sys.stderr)
    finally:
        provider.force_flush()
        provider.shutdown()
        drop()
    summary: dict[str, Any] = {}
    for mode in MODES:
        ratios = [c[mode]["runs_per_s"] / c["none"]["runs_per_s"] for c in cycles]
        cpu = [c[mode]["cpu_ms_per_run"] / c["none"]["cpu_ms_per_run"] for c in cycles]
        summary[mode] = {
            "runs_per_s": statistics.median(c[mode]["runs_per_s"] for c in cycles),
            "cpu_ms_per_run": statistics.median(c[mode]["cpu_ms_per_run"] for c in cycles),
            "ratio_to_none": statistics.median(ratios),
            "ratio_quartiles": statistics.quantiles(ratios, n=4)[::2]
            if len(ratios) > 1
            else ratios,
            "cost_percent": round((1 - statistics.median(ratios)) * 100, 1),
            "cpu_ratio_to_none": statistics.median(cpu),
        }
    return {"cycles": cycles, "summary": summary, "spans_exported": exporter.spans}


def hooks_cpu_us(repeats: int = 7, n: int = 2000) -> dict[str, float]:
    """CPU microseconds the observers add to one no-op run's drain, measured alone on one
    thread (best of `repeats`): the claim hook, a segment with one step, its end. Far less
    sensitive to a loaded machine than a drain rate."""
    modes, provider, _ = observers()
    run = Run.enqueue(
        run_id=uuid.uuid4(),
        agent="scripted",
        request_digest="0" * 64,
        actor="bench",
        trace_parent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    run.mark_committed()
    run.claim(holder="worker:bench", lease_ms=60_000)
    run.mark_committed()
    claimed = [ClaimedRun(run=run, request=b"{}", age_s=0.01)]
    end = StepEnd(1, {"content_length": 12, "content_redacted": True})
    figures = {}
    for mode in [m for m in MODES if m != "metrics+sdk-10%"]:  # one run: sampled or not
        telemetry = modes[mode]
        best = float("inf")
        for _ in range(repeats):
            started = time.process_time()
            for _ in range(n):
                telemetry.claimed(claimed, 0.001)
                segment = telemetry.segment_started(run)
                step = segment.step_started("llm", "think-1", 1)
                step.ended(end)
                step.close()
                segment.ended(Outcome.COMPLETED)
            best = min(best, (time.process_time() - started) / n * 1e6)
        figures[mode] = best
    provider.shutdown()
    return {mode: value - figures["none"] for mode, value in figures.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", "-b", type=int, default=200, help="runs per timed drain")
    parser.add_argument("--cycles", type=int, default=9, help="drains per mode")
    parser.add_argument("--concurrency", "-c", type=int, default=4)
    parser.add_argument(
        "--pg",
        default=os.environ.get("STEPTRAIL_BENCH_PG"),
        help="also measure PostgreSQL at this server URL (no database name)",
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    configure_logging("json", "warning")
    results: dict[str, Any] = {
        "block": args.block,
        "cycles": args.cycles,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    results["hooks_cpu_us_per_run"] = hooks_cpu_us()
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ["sqlite", *(["postgres"] if args.pg else [])]:
            results[backend] = bench(backend, args, Path(tmp))
    print(
        f"no-op drain, blocks of {args.block} runs, concurrency {args.concurrency}, medians "
        f"of {args.cycles} cycles (load average {results['load_average'][0]:.1f})"
    )
    print("| backend | mode | runs/s | rate vs none (quartiles) | cost | CPU/run vs none |")
    print("|---|---|---:|---:|---:|---:|")
    for backend in ("sqlite", "postgres"):
        if backend not in results:
            continue
        for mode, s in results[backend]["summary"].items():
            low, high = s["ratio_quartiles"][0], s["ratio_quartiles"][-1]
            print(
                f"| {backend} | {mode} | {s['runs_per_s']:,.0f} | {s['ratio_to_none']:.3f} "
                f"({low:.2f}-{high:.2f}) | {s['cost_percent']:.1f} % | "
                f"{s['cpu_ratio_to_none']:.3f} |"
            )
    hooks = results["hooks_cpu_us_per_run"]
    print()
    print("| observers alone (one thread, best of 7) | CPU per run | share of `none` CPU per run |")
    print("|---|---:|---:|")
    for mode in [m for m in hooks if m != "none"]:
        shares = []
        for backend in ("sqlite", "postgres"):
            if backend in results:
                base_us = results[backend]["summary"]["none"]["cpu_ms_per_run"] * 1000
                shares.append(f"{backend} {hooks[mode] / base_us * 100:.1f} %")
        print(f"| {mode} | {hooks[mode]:.1f} µs | {', '.join(shares)} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
