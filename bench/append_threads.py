"""steptrail step appends from many threads of one process: SQLite's natural shape.

One process, T threads, each holding its own claimed run and appending steps to it
(`Run.record_step` with the scripted agent's filtered payload + `store.append`, the same
append `bench/run.py` times on one thread), for T = 1, 4, 16, 64 by default. Reported per
backend and T: appends/s over all threads, and that rate / the single-thread bare INSERT
loop of `bench/run.py` (measured in the same invocation, before every T). On SQLite every
append is a write transaction and writes take turns (one writer at a time, ADR 0012), so
threads add no parallel writes, only overlap of their Python work with another's commit; on
PostgreSQL they share the store's connection pool (4 by default).

    python bench/append_threads.py                    # SQLite and PostgreSQL, T = 1 4 16 64
    python bench/append_threads.py --threads 1 8 --appends 4000 --json out.json

Databases: SQLite files in a temporary folder; on PostgreSQL `steptrail_bench_threads`
(dropped and re-created; run it under the bench lock like the other scripts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from run import (
    AGENT,
    DEFAULT_PG,
    BenchError,
    bench_raw_sqlite,
    check_postgres,
    drop_database,
    quiet_logging,
    recreate_database,
    step_payload,
    steptrail_settings,
)

from steptrail.domain.run import Run
from steptrail.runtime import Runtime, open_runtime
from steptrail.workers.holders import holder_name

DB_THREADS = "steptrail_bench_threads"


def claimed_runs(runtime: Runtime, n: int) -> list[Run]:
    for _ in range(n):
        runtime.enqueue(AGENT, {"steps": 1})
    runs = []
    for _ in range(n):
        claimed = runtime.store.claim(
            holder=holder_name("bench"), lease_ms=runtime.settings.lease_ms, agents=[AGENT]
        )
        if claimed is None:
            raise BenchError("a run just enqueued could not be claimed")
        runs.append(claimed.run)
    return runs


def append_rate(url: str, threads: int, total: int) -> float:
    """Appends/s of `threads` threads appending `total` steps between them, each to its
    own claimed run, released together."""
    per_thread = max(1, total // threads)
    payloads = [step_payload(i) for i in range(1, per_thread + 1)]
    with open_runtime(settings=steptrail_settings(url)) as runtime:
        runs = claimed_runs(runtime, threads)
        barrier = threading.Barrier(threads + 1)
        errors: list[BaseException] = []

        def work(run: Run) -> None:
            barrier.wait()
            try:
                for i, payload in enumerate(payloads, start=1):
                    run.record_step(
                        kind="llm",
                        name=f"think-{i}",
                        duration_ms=0,
                        payload=payload,
                        tokens=10,
                        cost=0.0001,
                    )
                    runtime.store.append(run)
            except BaseException as error:  # reported after the join
                errors.append(error)

        pool = [threading.Thread(target=work, args=(run,)) for run in runs]
        for thread in pool:
            thread.start()
        barrier.wait()
        started = time.perf_counter()
        for thread in pool:
            thread.join()
        elapsed = time.perf_counter() - started
        if errors:
            raise BenchError(f"an appending thread failed: {errors[0]!r}")
    return per_thread * threads / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--appends", type=int, default=3000, help="appends per T (total)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL server URL, no database")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    args = parser.parse_args()
    quiet_logging()
    backends = ["sqlite"] if args.no_pg else ["sqlite", "postgres"]
    if not args.no_pg:
        try:
            check_postgres(args.pg)
        except BenchError as error:
            print(error, file=sys.stderr)
            return 2
    figures: dict[str, dict[int, list[dict[str, float]]]] = {
        b: {t: [] for t in args.threads} for b in backends
    }
    try:
        with tempfile.TemporaryDirectory() as folder:
            for index in range(args.rounds):
                for threads in args.threads:
                    raw = bench_raw_sqlite(Path(folder) / f"raw-{index}-{threads}.db", 3000)
                    for backend in backends:
                        if backend == "sqlite":
                            url = f"sqlite:///{Path(folder) / f'threads-{index}-{threads}.db'}"
                        else:
                            url = recreate_database(args.pg, DB_THREADS)
                        rate = append_rate(url, threads, args.appends)
                        figures[backend][threads].append(
                            {"appends_per_s": rate, "raw_sqlite_insert": raw, "ratio": rate / raw}
                        )
    finally:
        if not args.no_pg:
            drop_database(args.pg, DB_THREADS)
    print(f"step appends from T threads of one process; {args.rounds} round(s), medians")
    print("ratio: appends/s over the single-thread bare SQLite INSERT loop of the same round\n")
    summary: dict[str, Any] = {"appends": args.appends, "rounds": args.rounds}
    for backend in backends:
        summary[backend] = {}
        for threads in args.threads:
            rows = figures[backend][threads]
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            summary[backend][threads] = {"median": med, "rounds": rows}
            print(
                f"{backend:8s} T={threads:3d}: {med['appends_per_s']:8.0f} appends/s, "
                f"bare SQLite INSERT {med['raw_sqlite_insert']:8.0f}/s, ratio {med['ratio']:.2f}"
            )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
