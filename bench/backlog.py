"""Draining a large backlog: does a claim cost its batch or the whole backlog? (ADR 0037)

    python bench/backlog.py                       # 20,000 runs, PostgreSQL, c=4, cold statistics
    python bench/backlog.py --runs 5000 --stats stale --json out.json
    python bench/backlog.py --backend sqlite

N runs of the built-in `scripted` agent (`{"steps": 1}`) are enqueued (8 threads) and
folded into the reporting views (neither timed), then ONE worker process — this one —
drains them with `Runtime.worker(concurrency=C, burst=True).run()`, recording the moment
each run finishes.
Reported: the drain rate over the first and the last quarter of the runs, and their ratio
(last / first: 1.0 is flat; the scale probe of issue 16 saw ~5 before ADR 0037: ~115 runs/s
at the start, ~570/s at the end), plus the worker's CPU per run.

`--stats` picks what the planner knows when the drain starts:
* `cold` (default): autovacuum is off for the run index and nothing was ever analysed — a
  fresh backlog with no statistics, the probe's case;
* `stale`: the run index was analysed while it was empty, then filled (statistics that say
  nothing is queued);
* `fresh`: ANALYZE after the enqueue.

The database gets a unique name (`steptrail_backlog_<pid>_<hex>`) and is dropped at the end,
so this bench may run beside others; it still loads the machine (run it under
`flock /work/wt/bench.lock` when others measure).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")

import psycopg
from psycopg import sql

from steptrail.infrastructure.logging import configure_logging
from steptrail.infrastructure.settings import Settings
from steptrail.runtime import open_runtime
from steptrail.workers.execute import SegmentResult

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432"
AGENT = "scripted"
REQUEST = {"steps": 1}


def pg_url(base: str, database: str) -> str:
    return f"{base.rstrip('/')}/{database}"


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def enqueue_all(url: str, runs: int, threads: int = 8) -> None:
    settings = Settings(database_url=url, log_level="warning", poll_interval=0.1)
    with open_runtime(settings=settings) as rt:
        per = [runs // threads + (1 if i < runs % threads else 0) for i in range(threads)]

        def work(n: int) -> None:
            for _ in range(n):
                rt.enqueue(AGENT, REQUEST)

        pool = [threading.Thread(target=work, args=(n,)) for n in per]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        # The worker keeps the reporting views: fold the enqueues now (a live projector
        # would have folded them as they came), so the drain's first quarter does not pay
        # for 20k Queued events that the last quarter does not.
        rt.project()


def drain(url: str, runs: int, concurrency: int) -> dict[str, float]:
    settings = Settings(database_url=url, log_level="warning", poll_interval=0.1)
    done: list[float] = []
    lock = threading.Lock()

    def finished(_: SegmentResult) -> None:
        now = time.perf_counter()
        with lock:
            done.append(now)

    with open_runtime(settings=settings) as rt:
        worker = rt.worker(concurrency=concurrency, burst=True, on_result=finished)
        cpu0, t0 = cpu_s(), time.perf_counter()
        report = worker.run()
        cpu1, t1 = cpu_s(), time.perf_counter()
    completed = report.outcomes.get("completed", 0)
    if completed != runs:
        raise SystemExit(f"only {completed} of {runs} runs completed: {report.as_dict()}")
    done.sort()
    quarter = runs // 4
    first = quarter / (done[quarter - 1] - t0)
    last = quarter / (done[-1] - done[-quarter - 1])
    return {
        "drain_s": t1 - t0,
        "rate": runs / (t1 - t0),
        "first_quarter_rate": first,
        "last_quarter_rate": last,
        "last_over_first": last / first,
        "worker_cpu_ms_per_run": (cpu1 - cpu0) * 1000 / runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--concurrency", "-c", type=int, default=4)
    parser.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--stats", choices=["cold", "stale", "fresh"], default="cold")
    parser.add_argument("--pg", default=os.environ.get("STEPTRAIL_BENCH_PG", DEFAULT_PG))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.runs < 8:
        parser.error("--runs must be at least 8")
    configure_logging("json", "warning")
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    name = f"steptrail_backlog_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    tmp = tempfile.TemporaryDirectory()
    admin = pg_url(args.pg, "postgres")
    if args.backend == "postgres":
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = pg_url(args.pg, name)
    else:
        url = f"sqlite:///{Path(tmp.name) / 'backlog.db'}"
    try:
        open_runtime(settings=Settings(database_url=url, log_level="warning")).close()
        if args.backend == "postgres":
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ALTER TABLE steptrail_runs SET (autovacuum_enabled = off)")
                if args.stats == "stale":
                    conn.execute("ANALYZE steptrail_runs")
        t = time.perf_counter()
        enqueue_all(url, args.runs)
        enqueued_s = time.perf_counter() - t
        if args.backend == "postgres":
            with psycopg.connect(url, autocommit=True) as conn:
                if args.stats == "fresh":
                    conn.execute("ANALYZE steptrail_runs")
                conn.execute("CHECKPOINT")
        figures = drain(url, args.runs, args.concurrency)
    finally:
        if args.backend == "postgres":
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        tmp.cleanup()
    load_after = (
        Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    )
    print(
        f"backlog drain: {args.backend}, {args.runs} runs, one process, c={args.concurrency}, "
        f"statistics {args.stats}; load average {load} -> {load_after}; "
        f"enqueued in {enqueued_s:.1f} s (not timed)\n"
        f"| figure | value |\n|---|---:|\n"
        f"| drain (runs/s) | {figures['rate']:.0f} |\n"
        f"| first quarter (runs/s) | {figures['first_quarter_rate']:.0f} |\n"
        f"| last quarter (runs/s) | {figures['last_quarter_rate']:.0f} |\n"
        f"| **last / first** (1.0 = flat) | **{figures['last_over_first']:.2f}** |\n"
        f"| worker CPU per run (ms) | {figures['worker_cpu_ms_per_run']:.2f} |"
    )
    if args.json:
        out: dict[str, Any] = {
            "backend": args.backend,
            "runs": args.runs,
            "concurrency": args.concurrency,
            "stats": args.stats,
            "load_average": [load, load_after],
            **figures,
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
