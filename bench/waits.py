"""Durable sleep at scale (issue 27, ADR 0073): how late sleeping runs wake, what a worker
spends while they sleep, and what sleeping runs cost the claim.

    python bench/waits.py    # 1,000 sleepers of 2 s; claims with 0 vs 100,000 asleep; both
    python bench/waits.py --runs 300 --asleep 20000 --backend sqlite --json out.json

**Wake-up lateness.** N runs of an agent that records a step, sleeps S seconds
(`ctx.sleep`) and records a second step are enqueued, then one worker of this process
(`Runtime.worker(concurrency=C)`, the default 1 s poll) drains them. Each run's lateness is
the wall time of its second step minus the first step's (replayed from the journal) minus
S: the store's clock, the poll and the claim together. While every run sleeps the bench
samples the process's threads and CPU: a sleeping run holds no thread, no slot, no lease.

**The claim with sleepers.** One run is enqueued and claimed (`store.claim_batch`, limit 1)
`--samples` times, on a database holding nothing else and on one holding M runs asleep of
the same agent (their run-index rows as a sleep leaves them: `waiting_for_timer`, a wake-up
a day away; set by one UPDATE after a bulk enqueue, so that loading 100,000 sleepers takes
seconds, not a drain). Target (issue 27): p50 with M asleep / p50 with none ≤ 1.2 — the
claim walks the wake-up index from `now()` and never meets a sleeper.

Databases get unique names and are dropped at the end; SQLite files live in a temporary
folder.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")

import psycopg

import steptrail
from steptrail.runtime import Runtime, open_runtime

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432"


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Sleepers:
    """The sleeping agent and what the bench observes of it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lateness: list[float] = []
        self.due: list[float] = []  # when each woken run was due (wall clock)
        self.steps = 0  # step callables run so far (an idle window runs none)
        self.last_asleep = 0.0  # when the last run fell asleep
        self.asleep = 0
        self.lock = threading.Lock()
        self.app = steptrail.App()

        @self.app.agent("sleeper")
        def sleeper(ctx: steptrail.RunContext, request: dict[str, Any]) -> dict[str, Any]:
            started = ctx.step("think", "before", self._before)
            ctx.sleep(self.seconds)
            ctx.step("think", "after", lambda: self._after(started))
            return {}

    def _before(self) -> float:
        now = time.time()
        with self.lock:
            self.asleep += 1
            self.steps += 1
            self.last_asleep = now
        return now

    def _after(self, started: float) -> float:
        now = time.time()
        with self.lock:
            self.asleep -= 1
            self.steps += 1
            self.lateness.append(now - started - self.seconds)
            self.due.append(started + self.seconds)
        return now


def wake_lateness(url: str, runs: int, seconds: float, concurrency: int) -> dict[str, float]:
    bench = Sleepers(seconds)
    with open_runtime(bench.app, url=url, log_level="warning") as rt:
        rt.enqueue_many([{"agent": "sleeper", "request": {}}] * runs)
        worker = rt.worker(concurrency=concurrency)
        thread = threading.Thread(target=worker.run, daemon=True)
        cpu0, t0 = cpu_s(), time.monotonic()
        thread.start()
        idle: list[tuple[float, int]] = []  # (CPU share, threads) of windows nothing ran in
        while len(bench.lateness) < runs and time.monotonic() - t0 < 120 + 4 * seconds:
            before_cpu, before = cpu_s(), time.monotonic()
            with bench.lock:
                steps = bench.steps
            time.sleep(0.2)
            with bench.lock:
                quiet = bench.steps == steps and bench.asleep > 0  # runs asleep, none ran
            if quiet:
                share = (cpu_s() - before_cpu) / (time.monotonic() - before)
                idle.append((share, threading.active_count()))
        worker.stop()
        thread.join(timeout=30)
        wall, cpu = time.monotonic() - t0, cpu_s() - cpu0
    if len(bench.lateness) < runs:
        raise SystemExit(f"only {len(bench.lateness)} of {runs} sleepers woke")
    # Runs due after the last one fell asleep woke on a worker with no backlog: their
    # lateness is the wake-up's own (the poll, the claim), not the queue ahead of them.
    idle_late = [
        late for late, due in zip(bench.lateness, bench.due, strict=True) if due > bench.last_asleep
    ]
    return {
        "runs": runs,
        "sleep_s": seconds,
        "idle_woken": len(idle_late),
        "idle_lateness_p50_ms": 1000 * statistics.median(idle_late) if idle_late else float("nan"),
        "idle_lateness_p99_ms": 1000 * pct(idle_late, 0.99) if idle_late else float("nan"),
        "fall_asleep_s": bench.last_asleep - min(d - seconds for d in bench.due),
        "lateness_p50_ms": 1000 * statistics.median(bench.lateness),
        "lateness_p99_ms": 1000 * pct(bench.lateness, 0.99),
        "lateness_max_ms": 1000 * max(bench.lateness),
        "asleep_cpu_share": statistics.median(s for s, _ in idle) if idle else float("nan"),
        "asleep_threads": max(n for _, n in idle) if idle else -1,
        "asleep_windows": len(idle),
        "cpu_ms_per_run": 1000 * cpu / runs,
        "wall_s": wall,
    }


def put_to_sleep(rt: Runtime, count: int) -> None:
    """`count` runs of `scripted` whose index rows say what a sleep leaves: waiting for a
    timer, claimable a day from now."""
    for start in range(0, count, 5000):
        rt.enqueue_many([{"agent": "scripted", "request": {}}] * min(5000, count - start))
    store: Any = rt.store
    if store.backend == "sqlite":
        with store._write() as (cur, at):
            cur.execute(
                "UPDATE steptrail_runs SET status = 'waiting_for_timer', available_at = :t",
                {"t": at + 86_400_000_000},
            )
        return
    with store._connection() as conn:
        conn.execute(
            "UPDATE steptrail_runs SET status = 'waiting_for_timer', "
            "available_at = now() + interval '1 day'"
        )
        conn.execute("VACUUM ANALYZE steptrail_runs")


def claim_cost(url: str, asleep: int, samples: int) -> dict[str, float]:
    with open_runtime(url=url, log_level="warning") as rt:
        if asleep:
            put_to_sleep(rt, asleep)
        store: Any = rt.store
        timings: list[float] = []
        for _ in range(samples):
            run_id = rt.enqueue("scripted", {})
            started = time.perf_counter()
            claimed = store.claim_batch(
                holder="bench:claim", lease_ms=600_000, agents=["scripted"], limit=1
            )
            timings.append(time.perf_counter() - started)
            if [c.run.id for c in claimed] != [run_id]:
                raise SystemExit(f"the claim took {[c.run.id for c in claimed]}, not {run_id}")
    return {
        "asleep": asleep,
        "claim_p50_ms": 1000 * statistics.median(timings),
        "claim_p99_ms": 1000 * pct(timings, 0.99),
    }


class Databases:
    """Fresh databases for one backend: SQLite files in a folder, or PostgreSQL databases
    with unique names, dropped at the end."""

    def __init__(self, backend: str, pg: str, folder: Path) -> None:
        self.backend, self.pg, self.folder = backend, pg, folder
        self.made: list[str] = []

    def new(self) -> str:
        name = f"steptrail_waits_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        if self.backend == "sqlite":
            return f"sqlite:///{self.folder / name}.db"
        with psycopg.connect(f"{self.pg}/postgres", autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        return f"{self.pg}/{name}"

    def drop(self) -> None:
        if not self.made:
            return
        with psycopg.connect(f"{self.pg}/postgres", autocommit=True) as admin:
            for name in self.made:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def measure(backend: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    dbs = Databases(backend, args.pg, folder)
    try:
        woke = wake_lateness(dbs.new(), args.runs, args.sleep, args.concurrency)
        print(f"{backend}: {args.runs} sleepers woke", file=sys.stderr)
        empty = claim_cost(dbs.new(), 0, args.samples)
        full = claim_cost(dbs.new(), args.asleep, args.samples)
        print(f"{backend}: claims measured", file=sys.stderr)
    finally:
        dbs.drop()
    return {
        "wake": woke,
        "claim_empty": empty,
        "claim_asleep": full,
        "claim_ratio_p50": full["claim_p50_ms"] / empty["claim_p50_ms"],
    }


def markdown(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"| figure ({args.runs} runs sleeping {args.sleep:g} s, {args.asleep:,} asleep "
        f"for the claim) | " + " | ".join(results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    rows = [
        ("seconds to put every run to sleep", lambda r: r["wake"]["fall_asleep_s"]),
        ("runs due after that (woken with no backlog)", lambda r: r["wake"]["idle_woken"]),
        ("their wake-up lateness p50 (ms)", lambda r: r["wake"]["idle_lateness_p50_ms"]),
        ("their wake-up lateness p99 (ms)", lambda r: r["wake"]["idle_lateness_p99_ms"]),
        ("wake-up lateness p50, all (ms)", lambda r: r["wake"]["lateness_p50_ms"]),
        ("wake-up lateness p99, all (ms)", lambda r: r["wake"]["lateness_p99_ms"]),
        ("wake-up lateness max, all (ms)", lambda r: r["wake"]["lateness_max_ms"]),
        ("CPU share while runs sleep and none runs", lambda r: r["wake"]["asleep_cpu_share"]),
        ("threads meanwhile", lambda r: r["wake"]["asleep_threads"]),
        ("claim p50, none asleep (ms)", lambda r: r["claim_empty"]["claim_p50_ms"]),
        (f"claim p50, {args.asleep:,} asleep (ms)", lambda r: r["claim_asleep"]["claim_p50_ms"]),
        ("claim p50 ratio (target ≤ 1.2)", lambda r: r["claim_ratio_p50"]),
    ]
    for label, value in rows:
        lines.append(
            f"| {label} | " + " | ".join(f"{value(r):.3g}" for r in results.values()) + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1000, help="sleeping runs (1000)")
    parser.add_argument("--sleep", type=float, default=2.0, help="seconds each sleeps (2)")
    parser.add_argument("--concurrency", "-c", type=int, default=16, help="worker slots (16)")
    parser.add_argument("--asleep", type=int, default=100_000, help="sleepers for the claim")
    parser.add_argument("--samples", type=int, default=200, help="claims timed (200)")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg", default=os.environ.get("STEPTRAIL_BENCH_PG", DEFAULT_PG))
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="steptrail-waits-") as tmp:
        for backend in backends:
            results[backend] = measure(backend, args, Path(tmp))
    print(markdown(results, args))
    if args.json:
        report = {"config": {k: v for k, v in vars(args).items() if k != "json"}, **results}
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
