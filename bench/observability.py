"""What observability costs a worker: no-op drain rate with and without metrics and tracing.

Three modes drain blocks of no-op runs (the built-in `scripted` agent, one step) with one
in-process worker at concurrency C, on one database, mode after mode, the order rotating
every cycle:

* `none`: the runtime's telemetry replaced by the no-op seam (nothing observed at all);
* `metrics`: the worker metrics (Prometheus) only;
* `metrics+tracing`: worker metrics and OpenTelemetry tracing through the SDK, with a batch
  span processor and an exporter that drops every span (the "no-op exporter"): spans are
  created, filled, ended and queued as in production, nothing leaves the process.

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

from steptrail.infrastructure.logging import configure_logging
from steptrail.infrastructure.settings import Settings
from steptrail.runtime import Runtime, open_runtime
from steptrail.tracing import Tracing
from steptrail.worker_metrics import WorkerMetrics
from steptrail.workers.telemetry import NO_TELEMETRY, Telemetry, compose

MODES = ("none", "metrics", "metrics+tracing")


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
    modes = {
        "none": NO_TELEMETRY,
        "metrics": WorkerMetrics(),
        "metrics+tracing": compose(WorkerMetrics(), Tracing(provider)),
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
                order = MODES[cycle % 3 :] + MODES[: cycle % 3]
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
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
