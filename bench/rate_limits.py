"""Rate limits (issue 28, ADR 0080): what a limited step costs a drain, and how close to the
limit a drain under it runs.

    python bench/rate_limits.py                       # both backends
    python bench/rate_limits.py --runs 300 --backend sqlite --json out.json

**Cost.** N runs of an agent with one `ctx.llm` step are drained by one worker of
`--concurrency` slots, once with a plain step and once with `limit="roomy"` (a limit of
10^6 requests a minute that never makes a step wait), alternated over `--rounds`: the median
ratio of throughputs is what the acquire (one more transaction per step) costs. A third
agent, `gated`, has the plain step and a run-level limit (`rate_limit="roomy"`, ADR 0083):
its ratio is what one grant per run (and its `rate_limit` step) costs. Reported as ratios,
never asserted.

**Pace.** N runs under a limit of R requests per second (default 40; margin 0.2 s) are
drained with 8 slots: the fastest drain the limit allows against the measured one (1.0:
the drain kept up with the window), and the most calls seen in any 1 s window (which must
stay ≤ R).

Databases get unique names and are dropped at the end; SQLite files live in a temporary
folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from bisect import bisect_right
from pathlib import Path
from typing import Any

os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")

import psycopg

import steptrail
from steptrail.runtime import open_runtime

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432"


def make_app(rate: int) -> tuple[steptrail.App, list[float]]:
    calls: list[float] = []
    lock = threading.Lock()
    app = steptrail.App()
    app.rate_limit("roomy", requests=1_000_000, per=60)
    app.rate_limit("paced", requests=rate, per=1)

    def call() -> str:
        with lock:
            calls.append(time.time())
        return "answer"

    @app.agent("plain")
    def plain(ctx: steptrail.RunContext, request: dict[str, Any]) -> str:
        return ctx.llm("ask", call)

    @app.agent("roomy")
    def roomy(ctx: steptrail.RunContext, request: dict[str, Any]) -> str:
        return ctx.llm("ask", call, limit="roomy", tokens=1)

    # The same plain step, the run taking one grant of "roomy" before it (ADR 0083).
    @app.agent("gated", rate_limit="roomy")
    def gated(ctx: steptrail.RunContext, request: dict[str, Any]) -> str:
        return ctx.llm("ask", call)

    @app.agent("paced")
    def paced(ctx: steptrail.RunContext, request: dict[str, Any]) -> str:
        return ctx.llm("ask", call, limit="paced")

    return app, calls


def drain(url: str, app: steptrail.App, agent: str, runs: int, concurrency: int) -> float:
    """Seconds to drain `runs` runs of `agent` (a sleeping run woken by later passes)."""
    settings = steptrail.Settings(database_url=url, poll_interval=0.05, log_level="warning")
    rt = open_runtime(app, settings=settings)
    try:
        rt.enqueue_many([{"agent": agent, "request": {}} for _ in range(runs)])
        started = time.perf_counter()
        while len(rt.runs(agent=agent, status="completed", limit=runs + 1)) < runs:
            rt.work(burst=True, concurrency=concurrency)
            time.sleep(0.02)
        return time.perf_counter() - started
    finally:
        rt.close()


def most_in_window(calls: list[float], per: float) -> int:
    calls = sorted(calls)
    return max(bisect_right(calls, t + per) - i for i, t in enumerate(calls))


def fresh(backend: str, folder: Path, pg: str) -> tuple[str, Any]:
    if backend == "sqlite":
        return f"sqlite:///{folder / (uuid.uuid4().hex + '.db')}", lambda: None
    name = f"steptrail_bench_limits_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(f"{pg}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"{pg}/{name}", drop


def bench(backend: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    app, calls = make_app(args.rate)
    out: dict[str, Any] = {"backend": backend, "runs": args.runs, "rounds": args.rounds}
    agents = ("plain", "roomy", "gated")
    rates: dict[str, list[float]] = {agent: [] for agent in agents}
    ratios, gated_ratios = [], []
    for n in range(args.rounds):  # rotated, so that a noisy neighbour hits each alike
        for agent in agents[n % 3 :] + agents[: n % 3]:
            url, drop = fresh(backend, folder, args.pg)
            try:
                seconds = drain(url, app, agent, args.runs, args.concurrency)
            finally:
                drop()
            rates[agent].append(args.runs / seconds)
        ratios.append(rates["roomy"][-1] / rates["plain"][-1])
        gated_ratios.append(rates["gated"][-1] / rates["plain"][-1])
    for agent, measured in rates.items():
        out[f"{agent}_runs_per_s"] = round(statistics.median(measured), 1)
    out["limited_vs_plain"] = round(statistics.median(ratios), 3)
    out["run_level_vs_plain"] = round(statistics.median(gated_ratios), 3)
    calls.clear()
    url, drop = fresh(backend, folder, args.pg)
    try:
        seconds = drain(url, app, "paced", args.runs, 8)
    finally:
        drop()
    # The fastest drain the limit allows: R at once, then R more every 1.2 s (the window
    # and the default margin), so the last call comes (ceil(N / R) - 1) * 1.2 s in.
    fastest = (-(-args.runs // args.rate) - 1) * 1.2
    out["paced_limit_per_s"] = args.rate
    out["paced_runs_per_s"] = round(args.runs / seconds, 1)
    out["paced_fastest_vs_measured"] = round(fastest / seconds, 3)
    out["paced_most_in_any_1s"] = most_in_window(calls, 1.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--rate", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg", default=DEFAULT_PG)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    with tempfile.TemporaryDirectory() as folder:
        results = [bench(b, args, Path(folder)) for b in backends]
    for result in results:
        print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
