"""The scale benchmark's short phases, repeated on copies of built databases.

`bench/scale.py` builds each database once and measures each phase once, so one slow moment
of a shared machine decides a ratio. This script builds a PostgreSQL database per size once
(`bench/scale.py`'s loader, then `VACUUM ANALYZE`) and keeps it as a template; each round then
copies every template (`CREATE DATABASE … TEMPLATE`, seconds even at a million runs),
measures the hot path, the reaper, the reads and the purge on the copy, exactly as
`scale.py` does, and drops the copy. Sizes alternate within a round and their order flips
from round to round.

    python bench/scale_phases.py --sizes 10000,1000000 --rounds 3
    python bench/scale_phases.py --sizes 10000,1000000 --rounds 3 --rebuild   # new templates

Templates are named `steptrail_phases_<size>` and kept for the next invocation (`--rebuild`
builds them again; `--drop` removes them at the end). PostgreSQL only: SQLite's figures are
measured by `scale.py` on one file per size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import psycopg
from run import drop_database, pg_url, recreate_database
from scale import build, command_env, hot_path, purge, reads, reaper, say

from steptrail.infrastructure.settings import Settings
from steptrail.runtime import open_runtime

PHASES = (
    "drain_per_s",
    "reap_ms_per_run",
    "stats_s",
    "runs_s",
    "runs_failed_s",
    "show_s",
    "purge_ms_per_run",
    "purge_batches_ms_per_run",
    "after_purge_s",
)


def exists(pg: str, name: str) -> bool:
    with psycopg.connect(pg_url(pg, "postgres"), autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    return row is not None


def make_template(pg: str, size: int, purged: int) -> str:
    name = f"steptrail_phases_{size}"
    url = recreate_database(pg, name)
    with open_runtime(settings=Settings(database_url=url, log_level="warning")) as rt:
        say(f"template {size:,}: building")
        build(rt, size, min(purged, size // 2), say)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return name


def phases(url: str, args: argparse.Namespace) -> dict[str, float]:
    env = command_env(url)
    figures: dict[str, float] = {}
    with open_runtime(settings=Settings(database_url=url, log_level="warning")) as rt:
        figures.update(hot_path(rt, args.runs, args.concurrency))
        figures.update(reaper(rt, args.stale))
        figures.update(reads(rt, env, args.repeat))
        figures.update(purge(rt))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sizes", default="10000,1000000", help="history sizes (runs)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--runs", type=int, default=2000, help="hot-path backlog drained")
    parser.add_argument("--concurrency", "-c", type=int, default=4)
    parser.add_argument("--stale", type=int, default=1000, help="stale runs reaped")
    parser.add_argument("--purge", type=int, default=1000, help="old runs in the template")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions of each read")
    parser.add_argument("--rebuild", action="store_true", help="build the templates again")
    parser.add_argument("--drop", action="store_true", help="drop the templates at the end")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.rounds < 1 or min(sizes) < 2:
        parser.error("--rounds must be at least 1 and every size at least 2")
    pg = args.pg.rstrip("/")
    templates = {}
    for size in sizes:
        name = f"steptrail_phases_{size}"
        templates[size] = (
            name if exists(pg, name) and not args.rebuild else make_template(pg, size, args.purge)
        )
    results: dict[int, list[dict[str, float]]] = {size: [] for size in sizes}
    for index in range(args.rounds):
        order = sizes if index % 2 == 0 else sizes[::-1]
        for size in order:
            copy = f"{templates[size]}_copy"
            url = recreate_database(pg, copy, template=templates[size])
            try:
                results[size].append(phases(url, args))
            finally:
                drop_database(pg, copy)
            say(f"round {index + 1}/{args.rounds}, {size:,}: {json.dumps(results[size][-1])}")
    small, large = sizes[0], sizes[-1]
    lines = [
        f"| figure | {small:,} (median) | {large:,} (median) | ratio | per round |",
        "|---|---:|---:|---:|---|",
    ]
    for key in PHASES:
        a = statistics.median(r[key] for r in results[small])
        b = statistics.median(r[key] for r in results[large])
        per_round = ", ".join(
            f"{y[key] / x[key]:.2f}" for x, y in zip(results[small], results[large], strict=True)
        )
        lines.append(f"| {key} | {a:.4g} | {b:.4g} | {b / a:.2f} | {per_round} |")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"sizes": sizes, "results": results}, indent=1))
    if args.drop:
        for name in templates.values():
            drop_database(pg, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
