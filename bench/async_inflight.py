"""In-flight runs held by one worker process: async agents on one event loop against sync
agents on a thread each, measured in one invocation on SQLite and PostgreSQL.

    python bench/async_inflight.py                     # 1,000 runs x 5 steps x 1 s, both backends
    python bench/async_inflight.py --runs 200 --json out.json
    python bench/async_inflight.py --concurrency 50,200,1000,3000 --json out.json   # a sweep

For each backend and each kind of agent, N runs are enqueued (not timed), then ONE worker
process runs `Runtime.worker(concurrency=N, burst=True).run()`; every run has S steps that
each wait W seconds (`await asyncio.sleep(W)` in the async agent, `time.sleep(W)` in the sync
one). The ideal wall time is S x W: every run in flight at once. Reported per case: the wall
time from the worker's start to its end, wall / ideal, peak RSS and peak OS thread count of
the worker process (sampled every 50 ms from /proc/self/status), and whether every run
completed; on PostgreSQL also the peak number of server connections to the database (read
from `pg_stat_activity` by the parent every 100 ms). The target (issue 12) is async wall <= 2 x
ideal on each backend.

`--concurrency 50,200,1000,3000` sweeps: for each value C, C runs drained by one worker of
concurrency C (issue 16: how a process holds many in-flight runs), every other figure as above.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")

import psycopg

import steptrail
from steptrail import App, AsyncRunContext, RunContext
from steptrail.infrastructure.logging import configure_logging

PG = os.environ.get("STEPTRAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
# One database per invocation: two of these (or another harness) never collide.
DATABASE = f"steptrail_bench_async_{os.getpid()}"

app = App()


@app.agent("inflight_async")
async def inflight_async(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, int]:
    wait = float(request["wait"])
    for k in range(int(request["steps"])):
        await ctx.llm(f"wait-{k + 1}", lambda k=k: asyncio.sleep(wait, result=k))
    return {"steps": int(request["steps"])}


@app.agent("inflight_sync")
def inflight_sync(ctx: RunContext, request: dict[str, Any]) -> dict[str, int]:
    wait = float(request["wait"])
    for k in range(int(request["steps"])):
        ctx.llm(f"wait-{k + 1}", lambda k=k: time.sleep(wait) or k)
    return {"steps": int(request["steps"])}


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _worker(url: str, agent: str, runs: int, out: Any) -> None:
    """Child process: drain the queue with one worker of concurrency `runs`; report."""
    configure_logging("console", "warning")
    peak = {"rss_kb": 0, "threads": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak["rss_kb"] = max(peak["rss_kb"], _status("VmRSS"))
            peak["threads"] = max(peak["threads"], _status("Threads"))

    with steptrail.open(app, url=url, lease_seconds=120) as rt:
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        report = rt.worker(concurrency=runs, burst=True).run()
        wall = time.perf_counter() - started
        stop.set()
        sampler.join()
        completed = len(rt.runs(status="completed", agent=agent, limit=runs + 1))
    out.put(
        {
            "wall_s": round(wall, 2),
            "peak_rss_mb": round(peak["rss_kb"] / 1024, 1),
            "peak_threads": peak["threads"],
            "completed": completed,
            "outcomes": dict(report.outcomes),
        }
    )


def _drop_pg() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


def _fresh_pg() -> str:
    _drop_pg()
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return f"{PG}/{DATABASE}"


class _Connections:
    """Peak number of server connections to the bench database, polled from the parent."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            while not self._stop.wait(0.1):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (DATABASE,)
                ).fetchone()
                self.peak = max(self.peak, row[0] if row else 0)

    def __enter__(self) -> _Connections:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def case(backend: str, agent: str, runs: int, steps: int, wait: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        url = _fresh_pg() if backend == "postgres" else f"sqlite:///{folder}/bench.db"
        with steptrail.open(app, url=url) as rt:
            for _ in range(runs):
                rt.enqueue(agent, {"steps": steps, "wait": wait})
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        child = ctx.Process(target=_worker, args=(url, agent, runs, out))
        connections: _Connections | None = None
        if backend == "postgres":
            connections = _Connections().__enter__()
        try:
            child.start()
            result: dict[str, Any] = out.get(timeout=900)
            child.join()
        finally:
            if connections is not None:
                connections.__exit__()
        if backend == "postgres":
            _drop_pg()
    ideal = steps * wait
    return {
        "backend": backend,
        "agent": "async" if agent.endswith("async") else "sync",
        "runs": runs,
        "ideal_s": ideal,
        "x_ideal": round(result["wall_s"] / ideal, 2),
        # Step appends per second over the whole drain (claims and settles not counted).
        "steps_per_s": round(runs * steps / result["wall_s"]),
        "peak_connections": connections.peak if connections is not None else None,
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument(
        "--concurrency",
        help="a sweep: comma-separated values C, each measured with C runs and concurrency C "
        "(overrides --runs), e.g. 50,200,1000,3000",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--wait", type=float, default=1.0)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--no-sync", action="store_true", help="skip the sync-agent cases")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    configure_logging("console", "warning")
    sizes = [int(c) for c in args.concurrency.split(",")] if args.concurrency else [args.runs]
    load_before = os.getloadavg()
    rows = []
    for runs in sizes:
        for backend in args.backends.split(","):
            agents = ["inflight_async"] + ([] if args.no_sync else ["inflight_sync"])
            for agent in agents:
                row = case(backend, agent, runs, args.steps, args.wait)
                rows.append(row)
                print(
                    f"{row['backend']:<9} {row['agent']:<6} runs={row['runs']:<5} "
                    f"wall={row['wall_s']:>6.2f}s  x ideal={row['x_ideal']:<5} "
                    f"rss={row['peak_rss_mb']:>6.1f} MB  threads={row['peak_threads']:<5} "
                    f"steps/s={row['steps_per_s']:<5} conns={row['peak_connections']} "
                    f"completed={row['completed']}",
                    flush=True,
                )
    print(
        f"\n{args.steps} steps x {args.wait:g} s per run; load average "
        f"{load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    print("| C | backend | agents | wall | x ideal | peak RSS | OS threads | steps/s | PG conns |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        conns = row["peak_connections"] if row["peak_connections"] is not None else "-"
        print(
            f"| {row['runs']:,} | {row['backend']} | {row['agent']} | {row['wall_s']:.2f} s "
            f"| {row['x_ideal']:.2f} | {row['peak_rss_mb']:.0f} MB | {row['peak_threads']:,} "
            f"| {row['steps_per_s']:,} | {conns} |"
        )
    if args.json:
        env = {
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "loadavg_start": load_before,
            "loadavg": os.getloadavg(),
        }
        args.json.write_text(json.dumps({"rows": rows, "env": env}, indent=2) + "\n")


if __name__ == "__main__":
    main()
