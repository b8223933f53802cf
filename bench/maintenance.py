"""Maintenance benchmark: `verify`, `rebuild run-index` and `purge` at two database sizes.

For each backend and each size (default 2,000 and 20,000 settled runs, built with the
stores' bulk loader through bench/scale.py's `build`, the oldest `--purge` runs (default
200) 400 days old), in one invocation:

1. `verify` and `rebuild run-index` as subprocesses (`python -m steptrail …`): wall time and
   peak RSS (`wait4`'s ru_maxrss), which must stay flat as the database grows (ADR 0040);
2. the longest enqueue latency seen while a `rebuild run-index` runs (this process enqueues
   one run at a time for as long as the rebuild subprocess lives): a rebuild must not stop
   writers for the whole rebuild, only for one range;
3. purge of the old runs: time per run of the batches (ADR 0041).

Then a table per backend with the ratio larger / smaller size; the load average at the
start and the end is printed with it.

    flock /work/wt/bench.lock python bench/maintenance.py                   # a few minutes
    python bench/maintenance.py --sizes 2000,50000 --backends sqlite
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")

import psycopg
import scale  # bench/scale.py: building databases, timed subprocesses, purge

from steptrail.infrastructure.settings import Settings
from steptrail.runtime import Runtime, open_runtime


def rebuild_under_enqueues(rt: Runtime, env: dict[str, str]) -> dict[str, float]:
    """Run `rebuild run-index` in a subprocess and enqueue one run at a time meanwhile;
    the longest and the median enqueue latency while it ran, and how many."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "steptrail", "rebuild", "run-index"],
        cwd=scale.REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latencies: list[float] = []
    started = time.perf_counter()
    while proc.poll() is None:
        t0 = time.perf_counter()
        rt.enqueue(scale.AGENT, scale.REQUEST)
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.005)
    wall = time.perf_counter() - started
    latencies.sort()
    return {
        "rebuild_wall_s": wall,
        "enqueues": float(len(latencies)),
        "enqueue_max_ms": 1000 * latencies[-1] if latencies else float("nan"),
        "enqueue_median_ms": 1000 * latencies[len(latencies) // 2] if latencies else float("nan"),
    }


def measure(url: str, size: int, cfg: argparse.Namespace, say: Callable[[str], None]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env.update(STEPTRAIL_DATABASE_URL=url, STEPTRAIL_LOG_LEVEL="warning")
    figures: dict[str, Any] = {"size": size}
    with open_runtime(settings=Settings(database_url=url, log_level="warning")) as rt:
        say(f"{rt.backend} {size:,}: building")
        figures.update(scale.build(rt, size, min(cfg.purge, size // 2), say))
        if url.startswith("postgres"):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ANALYZE")
        say(f"{rt.backend} {size:,}: verify, rebuild")
        for key, args in (("verify", ["verify"]), ("rebuild", ["rebuild", "run-index"])):
            done = scale.timed_subprocess(args, env, cfg.timeout)
            figures[f"{key}_s"], figures[f"{key}_rss_mb"] = done["s"], done["rss_mb"]
            figures[f"{key}_ok"] = done["code"] == 0
            if done["code"] != 0:
                say(f"  {key}: exit {done['code']}: {done.get('tail', '')}")
        say(f"{rt.backend} {size:,}: enqueues during a rebuild")
        figures.update(rebuild_under_enqueues(rt, env))
        say(f"{rt.backend} {size:,}: purge")
        # The rebuild just rewrote the whole index: fold its WAL back (SQLite) or vacuum
        # (PostgreSQL) first, or the purge's commits pay for checkpointing the rebuild's
        # writes, which grow with the database, not with the runs purged.
        rt.store.after_purge()
        figures.update(scale.purge(rt))
    return figures


ROWS = [
    ("verify_s", "verify (s)", "{:.2f}", None),
    ("verify_rss_mb", "verify peak RSS (MB)", "{:.0f}", "flat, ≤ 200"),
    ("rebuild_s", "rebuild run-index (s)", "{:.2f}", None),
    ("rebuild_rss_mb", "rebuild run-index peak RSS (MB)", "{:.0f}", "flat, ≤ 200"),
    ("enqueues", "enqueues during a rebuild", "{:.0f}", None),
    ("enqueue_median_ms", "enqueue latency during a rebuild, median (ms)", "{:.1f}", None),
    ("enqueue_max_ms", "enqueue latency during a rebuild, longest (ms)", "{:.1f}", "one range"),
    ("purged", "runs purged", "{:,}", None),
    ("purge_batches_ms_per_run", "purge batches (ms/run)", "{:.3f}", "≤ 1.5"),
    ("purge_ms_per_run", "purge with after_purge (ms/run)", "{:.3f}", None),
]


def table(backend: str, results: list[dict[str, Any]]) -> str:
    lines = scale.ratio_table(backend, results, ROWS)
    ok = all(r.get("verify_ok") and r.get("rebuild_ok") for r in results)
    lines += ["", f"verify and rebuild exited 0 at every size: {ok}"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="2000,20000", help="two database sizes (runs)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg", default=os.environ.get(
        "STEPTRAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432"))  # fmt: skip
    parser.add_argument(
        "--purge",
        type=int,
        default=200,
        help="old runs purged at each size (keep it a small part of the smaller size: "
        "purging half of a database packs several purged runs per page, see README)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="per maintenance command")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    cfg = parser.parse_args()
    results, load, seconds = scale.measure_sizes(cfg, "steptrail-maint-", measure)
    print(
        f"Maintenance benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} "
        f"CPUs, load average {load[0]:.2f} at the start and {load[1]:.2f} at the end, "
        f"{seconds:.0f} s in all; purge: {cfg.purge:,} runs.\n"
    )
    for backend, rows in results.items():
        print(table(backend, rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
