"""Operator reads at two history sizes: `stats`, `runs`, `show` and `audit` (ADR 0042).

For each backend (SQLite, PostgreSQL) and each history size H (default 2,000 and 200,000
settled runs, built with bench/scale.py's bulk loader, ADR 0044), plus one long run of
`--steps` steps (5,000 by default) and a few queued runs:

- `stats`, `runs`, `runs --status failed`, the next page of it (`--before`), `runs --status
  queued`, `runs --agent rare` (three runs of an agent loaded older than the whole history,
  ADR 0056), `show` of a settled one-step run, `show` of the long run (its default page),
  `show --json` of the long run (the whole trail), `audit --at` in the middle of the long run;
  each run in-process through the CLI (typer's CliRunner; the output captured and dropped),
  the median of `--repeat`;
- `show --all` of the long run (the whole trail drawn as a table), once, for reference.

- the same reads without the command line: each query alone, in this process (the median of
  50 calls; not measured with `--baseline`), and on PostgreSQL the shared buffers each one
  touches (`EXPLAIN (ANALYZE, BUFFERS)`), which load on the machine does not blur.

Then a table per backend: each figure at each size and the ratio largest / smallest size
(the target: ≤ 1.5 for every read; `show` of a 5,000-step run ≤ 0.5 s).

    python bench/reads.py                                   # both backends, 2k and 200k
    python bench/reads.py --sizes 2000,20000 --backends sqlite --json out.json
    ../main/.venv/bin/python bench/reads.py --baseline     # the same with main's code
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")

import psycopg
from scale import REQUEST, build, measure_sizes, ratio_table
from typer.testing import CliRunner

from steptrail.cli import cli
from steptrail.domain.digest import digest
from steptrail.domain.run import Run
from steptrail.infrastructure.settings import Settings
from steptrail.infrastructure.sqlfiles import queries as sql_queries
from steptrail.runtime import Runtime, open_runtime

PAGE = 100  # events in the trail page read from the end of the long run


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `low` (the long run's last page is read)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value

    return parse


def long_run(rt: Runtime, steps: int) -> UUID:
    """One settled run of `steps` steps, loaded like the history (a minute ago)."""
    run = Run.enqueue(
        run_id=uuid4(), agent="scripted", request_digest=digest(REQUEST), actor="reads-bench"
    )
    run.claim(holder="worker:reads-bench", lease_ms=60_000)
    for i in range(steps):
        run.record_step(
            kind="llm", name=f"step-{i}", duration_ms=3, payload={"i": i, "text": "x" * 40}
        )
    run.complete(result={"ok": True})
    rt.store.bulk_load_settled([(run, datetime.now(UTC) - timedelta(minutes=1), None)])
    return run.id


def rare_runs(rt: Runtime, n: int = 3) -> None:
    """`n` settled one-step runs of agent `rare`, loaded a year ago: older than the history,
    so that a walk of the creation index filtering by agent reads all of it."""
    loaded = []
    for i in range(n):
        run = Run.enqueue(
            run_id=uuid4(), agent="rare", request_digest=digest(REQUEST), actor="reads-bench"
        )
        run.claim(holder="worker:reads-bench", lease_ms=60_000)
        run.record_step(kind="llm", name="step", duration_ms=3, payload={"i": i})
        run.complete(result={"ok": True})
        loaded.append((run, datetime.now(UTC) - timedelta(days=365, minutes=i), None))
    rt.store.bulk_load_settled(loaded)


def timed(args: list[str], env: dict[str, str], repeat: int, baseline: bool) -> float | None:
    """Median seconds of `steptrail ARGS` in-process (output captured and dropped); None if
    this checkout's command line refuses them (an older one, run with `--baseline`)."""
    runner = CliRunner()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = runner.invoke(cli, args, env=env)
        times.append(time.perf_counter() - started)
        if result.exit_code == 2 and baseline:
            return None
        if result.exit_code != 0:
            raise RuntimeError(f"steptrail {' '.join(args)} exited {result.exit_code}")
    return statistics.median(times)


def measure(url: str, size: int, cfg: argparse.Namespace, say: Callable[[str], None]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env.update(STEPTRAIL_DATABASE_URL=url, STEPTRAIL_LOG_LEVEL="warning")
    figures: dict[str, Any] = {"size": size}
    with open_runtime(settings=Settings(database_url=url, log_level="warning")) as rt:
        say(f"{rt.backend} {size:,}: building")
        figures.update(build(rt, size, 0, say))
        rare_runs(rt)
        long = long_run(rt, cfg.steps)
        for _ in range(20):
            rt.enqueue("scripted", {"steps": 1})
        while rt.project(batch=5000):
            pass
        if url.startswith("postgres"):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ANALYZE")  # what autovacuum does after a bulk load
        # The newest completed run is the long one (loaded last): show the one before it.
        settled = next(r.run_id for r in rt.runs(status="completed", limit=2) if r.run_id != long)
        failed_page = rt.runs(status="failed", limit=10)
        say(f"{rt.backend} {size:,}: reads")
        r = cfg.repeat
        figures["stats_s"] = timed(["stats"], env, r, cfg.baseline)
        figures["runs_s"] = timed(["runs"], env, r, cfg.baseline)
        figures["runs_failed_s"] = timed(["runs", "--status", "failed"], env, r, cfg.baseline)
        figures["runs_failed_next_s"] = timed(
            [
                "runs",
                "--status",
                "failed",
                "--limit",
                "10",
                "--before",
                str(failed_page[-1].run_id),
            ],
            env,
            r,
            cfg.baseline,
        )
        figures["runs_queued_s"] = timed(["runs", "--status", "queued"], env, r, cfg.baseline)
        figures["runs_agent_s"] = timed(["runs", "--agent", "rare"], env, r, cfg.baseline)
        figures["show_s"] = timed(["show", str(settled)], env, r, cfg.baseline)
        figures["show_long_s"] = timed(["show", str(long)], env, r, cfg.baseline)
        figures["show_long_json_s"] = timed(["show", str(long), "--json"], env, r, cfg.baseline)
        figures["audit_long_s"] = timed(
            ["audit", str(long), "--at", str(cfg.steps // 2)], env, r, cfg.baseline
        )
        if not cfg.baseline:
            figures.update(queries(rt, long, failed_page[-1].run_id, cfg.steps))
            if url.startswith("postgres"):
                figures.update(pg_buffers(url, long, cfg.steps))
        figures["show_long_all_s"] = timed(["show", str(long), "--all"], env, 1, cfg.baseline)
    return figures


def queries(rt: Runtime, long: UUID, before: UUID, steps: int) -> dict[str, float]:
    """The reads alone, in this process (no command line, no runtime to open): the median
    of 50 calls each, in milliseconds. Less noisy than a whole command on a shared machine."""

    def ms(call: Callable[[], object]) -> float:
        times = []
        for _ in range(50):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        return 1000 * statistics.median(times)

    views = rt.views
    return {
        "q_counts_ms": ms(lambda: (views.status_counts(), views.reason_counts())),
        "q_health_ms": ms(views.health),
        "q_runs_ms": ms(lambda: rt.runs(limit=50)),
        "q_runs_failed_ms": ms(lambda: rt.runs(status="failed", limit=50)),
        "q_runs_failed_next_ms": ms(lambda: rt.runs(status="failed", limit=10, before=before)),
        "q_runs_queued_ms": ms(lambda: rt.runs(status="queued", limit=50)),
        "q_runs_agent_ms": ms(lambda: rt.runs(agent="rare", limit=50)),
        "q_trail_page_ms": ms(lambda: rt.history(long, first=steps - PAGE + 1, limit=PAGE)),
    }


def pg_buffers(url: str, long: UUID, steps: int) -> dict[str, float]:
    """PostgreSQL: the shared buffers each read touches (`EXPLAIN (ANALYZE, BUFFERS)`, the
    functions it calls included), a count that load on the machine does not blur."""
    q = sql_queries("postgres")
    top = {
        "agent": None,
        "reason": None,
        "limit": 50,
        "before_at": datetime(9999, 12, 31, tzinfo=UTC),
        "before_id": UUID(int=(1 << 128) - 1),
    }
    cases = {
        "buf_counts": ("select_reason_counts", {}),
        "buf_health": ("queue_health", {}),
        "buf_runs": ("select_runs", top),
        "buf_runs_failed": ("select_runs_status", {**top, "status": "failed"}),
        "buf_runs_agent": ("select_runs_agent", {**top, "agent": "rare"}),
        "buf_trail_page": (
            "select_history_page",
            {"run_id": long, "first": steps - PAGE + 1, "limit": PAGE},
        ),
    }
    found: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for key, (name, params) in cases.items():
            row = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q[name], params
            ).fetchone()
            assert row is not None
            plan = row[0][0]["Plan"]
            found[key] = float(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
    return found


ROWS = [
    ("load_s", "build: bulk load (s)", "{:.1f}", None),
    ("project_s", "build: views caught up (s)", "{:.1f}", None),
    ("stats_s", "stats (s)", "{:.3f}", "≤ 1.5"),
    ("runs_s", "runs (s)", "{:.3f}", "≤ 1.5"),
    ("runs_failed_s", "runs --status failed (s)", "{:.3f}", "≤ 1.5"),
    ("runs_failed_next_s", "runs --status failed --limit 10 --before … (s)", "{:.3f}", "≤ 1.5"),
    ("runs_queued_s", "runs --status queued (s)", "{:.3f}", "≤ 1.5"),
    ("runs_agent_s", "runs --agent rare (s)", "{:.3f}", "≤ 1.5"),
    ("show_s", "show, a 1-step run (s)", "{:.3f}", "≤ 1.5"),
    ("show_long_s", "show, the long run: default page (s)", "{:.3f}", "≤ 0.5 s"),
    ("show_long_json_s", "show --json, the long run, whole (s)", "{:.3f}", None),
    ("audit_long_s", "audit --at mid-run, the long run (s)", "{:.3f}", "≤ 1.5"),
    ("show_long_all_s", "show --all, the long run, drawn (s)", "{:.2f}", None),
    ("q_counts_ms", "query: status + reason counts (ms)", "{:.2f}", "≤ 1.5"),
    ("q_health_ms", "query: oldest queued + stale leases (ms)", "{:.2f}", "≤ 1.5"),
    ("q_runs_ms", "query: runs, 50 (ms)", "{:.2f}", "≤ 1.5"),
    ("q_runs_failed_ms", "query: runs failed, 50 (ms)", "{:.2f}", "≤ 1.5"),
    ("q_runs_failed_next_ms", "query: runs failed, next 10 (ms)", "{:.2f}", "≤ 1.5"),
    ("q_runs_queued_ms", "query: runs queued, 20 (ms)", "{:.2f}", "≤ 1.5"),
    ("q_runs_agent_ms", "query: runs of a rare agent, 3 (ms)", "{:.2f}", "≤ 1.5"),
    ("q_trail_page_ms", "query: 100 events of the long run (ms)", "{:.2f}", "≤ 1.5"),
    ("buf_counts", "PostgreSQL buffers: reason counts", "{:.0f}", "flat"),
    ("buf_health", "PostgreSQL buffers: oldest queued + stale leases", "{:.0f}", "flat"),
    ("buf_runs", "PostgreSQL buffers: runs, 50", "{:.0f}", "flat"),
    ("buf_runs_failed", "PostgreSQL buffers: runs failed, 50", "{:.0f}", "flat"),
    ("buf_runs_agent", "PostgreSQL buffers: runs of a rare agent", "{:.0f}", "flat"),
    ("buf_trail_page", "PostgreSQL buffers: 100 events of the long run", "{:.0f}", "flat"),
]


def table(backend: str, results: list[dict[str, Any]]) -> str:
    return "\n".join(ratio_table(backend, results, ROWS))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="2000,200000", help="history sizes (runs)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg", default=os.environ.get(
        "STEPTRAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432"))  # fmt: skip
    parser.add_argument(
        "--steps", type=at_least(PAGE), default=5000, help=f"steps of the long run (>= {PAGE})"
    )
    parser.add_argument("--repeat", type=int, default=5, help="repetitions of each read")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="run with an older checkout's interpreter: figures its CLI refuses are left out",
    )
    cfg = parser.parse_args()
    results, load, seconds = measure_sizes(cfg, "steptrail-reads-", measure)
    report = [
        f"Operator reads, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, load "
        f"average {load[0]:.2f} at the start and {load[1]:.2f} at the end, "
        f"{seconds:.0f} s in all; long run: {cfg.steps:,} steps; median of "
        f"{cfg.repeat}.",
        "",
    ]
    for backend, rows in results.items():
        report += [table(backend, rows), ""]
    print("\n".join(report))
    if cfg.json:
        cfg.json.write_text(
            json.dumps(
                {
                    "results": results,
                    "loadavg": {"start": load[0], "end": load[1]},
                    "config": {k: str(v) for k, v in vars(cfg).items()},
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
