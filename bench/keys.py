"""Concurrency limits per key (issue 28, ADR 0078): what keys cost the drain and the claim.

    python bench/keys.py                       # both backends, 1M keyed runs over 10k keys
    python bench/keys.py --runs 2000 --backlog 100000 --keys 1000 --backend sqlite

**Drain throughput.** `--runs` runs of a no-op agent are enqueued and drained by one worker
of this process (`Runtime.work(burst=True, concurrency=C)`), once without keys and once
spread over `--drain-keys` keys whose limit (`--limit`) leaves the worker's slots free, so
the figure is the keyed claim's own cost, not a limit holding runs back. Target (issue 28):
keyed runs/s / plain runs/s ≥ 0.8.

**Claim cost.** `--samples` claims of one run each (`store.claim_batch`, limit 1), timed
one by one, against a backlog of `--backlog` queued keyed runs over `--keys` keys, and
against one of 10,000 runs over keys in the same proportion (at least one). The backlog's
rows are written by one INSERT ... SELECT per database (the run index's triggers keep the
keys table, as for an enqueue), then analysed. Every claim takes a different key's run
(least recently served first) and leaves it running. Target (issue 28): p50 at the large
backlog / p50 at 10,000 runs ≤ 1.2.

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
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")

from waits import DEFAULT_PG, Databases, pct

import steptrail
from steptrail.runtime import open_runtime

SMALL = 10_000


def bench_app(limit: int) -> steptrail.App:
    app = steptrail.App()

    @app.agent("noop")
    def noop(ctx: steptrail.RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {}

    app.limit("k:*", limit)
    return app


def drain(url: str, runs: int, keys: int, limit: int, concurrency: int) -> float:
    """Runs per second of one burst worker over `runs` runs (`keys` keys; 0: no key)."""
    with open_runtime(bench_app(limit), url=url, log_level="warning") as rt:
        items = [
            {"agent": "noop", **({"concurrency_key": f"k:{n % keys}"} if keys else {})}
            for n in range(runs)
        ]
        rt.enqueue_many([{"agent": "noop"}] * 50)  # warm up: connections, plans, caches
        rt.work(burst=True, concurrency=concurrency)
        rt.enqueue_many(items)
        started = time.perf_counter()
        report = rt.work(burst=True, concurrency=concurrency)
        elapsed = time.perf_counter() - started
        if report.outcomes.get("completed") != runs:
            raise SystemExit(f"the drain completed {report.outcomes}, not {runs}")
    return runs / elapsed


def load_backlog(rt: Any, runs: int, keys: int, limit: int) -> None:
    """`runs` queued runs of `noop` over `keys` keys, written by one statement."""
    store = rt.store
    if store.backend == "sqlite":
        with store._write() as (cur, at):
            cur.execute(
                "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < :n)"
                " INSERT INTO steptrail_runs (run_id, agent, status, version, requeue_count,"
                " doc, available_at, created_at, updated_at, concurrency_key, concurrency_limit)"
                " SELECT lower(hex(randomblob(16))), 'noop', 'queued', 1, 0, '{}', :at - :n + i,"
                " :at, :at, 'k:' || (i % :keys), :limit FROM g",
                {"n": runs, "at": at, "keys": keys, "limit": limit},
            )
        with store._write() as (cur, _):
            cur.execute("ANALYZE")
        return
    with store._connection() as conn:
        conn.execute(
            "INSERT INTO steptrail_runs (run_id, agent, status, version, requeue_count, doc,"
            " available_at, created_at, updated_at, concurrency_key, concurrency_limit)"
            " SELECT gen_random_uuid(), 'noop', 'queued', 1, 0, '{}'::jsonb,"
            " now() - interval '1 hour' + g * interval '1 us', now(), now(),"
            " 'k:' || (g %% %(keys)s), %(limit)s FROM generate_series(1, %(n)s) AS g",
            {"n": runs, "keys": keys, "limit": limit},
        )
        conn.execute("VACUUM ANALYZE steptrail_runs")
        conn.execute("VACUUM ANALYZE steptrail_concurrency_keys")


def claim_cost(url: str, runs: int, keys: int, limit: int, samples: int) -> dict[str, float]:
    with open_runtime(bench_app(limit), url=url, log_level="warning") as rt:
        started = time.perf_counter()
        load_backlog(rt, runs, keys, limit)
        loaded = time.perf_counter() - started
        timings: list[float] = []
        for _ in range(samples):
            started = time.perf_counter()
            claimed = rt.store.claim_batch(
                holder="bench:keys", lease_ms=600_000, agents=["noop"], limit=1
            )
            timings.append(time.perf_counter() - started)
            if len(claimed) != 1:
                raise SystemExit(f"a claim took {len(claimed)} runs, not 1")
    return {
        "runs": runs,
        "keys": keys,
        "load_s": loaded,
        "claim_p50_ms": 1000 * statistics.median(timings),
        "claim_p90_ms": 1000 * pct(timings, 0.9),
    }


def measure(backend: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    dbs = Databases(backend, args.pg, folder)
    try:
        plain = drain(dbs.new(), args.runs, 0, args.limit, args.concurrency)
        keyed = drain(dbs.new(), args.runs, args.drain_keys, args.limit, args.concurrency)
        print(f"{backend}: drains measured", file=sys.stderr)
        small_keys = max(1, args.keys * SMALL // args.backlog)
        small = claim_cost(dbs.new(), SMALL, small_keys, args.limit, args.samples)
        large = claim_cost(dbs.new(), args.backlog, args.keys, args.limit, args.samples)
        print(f"{backend}: claims measured", file=sys.stderr)
    finally:
        dbs.drop()
    return {
        "drain_plain_runs_s": plain,
        "drain_keyed_runs_s": keyed,
        "drain_ratio": keyed / plain,
        "claim_small": small,
        "claim_large": large,
        "claim_ratio_p50": large["claim_p50_ms"] / small["claim_p50_ms"],
    }


def markdown(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"| figure ({args.runs} runs drained by {args.concurrency} slots; claims against "
        f"{args.backlog:,} runs / {args.keys:,} keys) | " + " | ".join(results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    rows = [
        ("drain without keys (runs/s)", lambda r: r["drain_plain_runs_s"]),
        (f"drain over {args.drain_keys} keys (runs/s)", lambda r: r["drain_keyed_runs_s"]),
        ("drain ratio (target ≥ 0.8)", lambda r: r["drain_ratio"]),
        ("claim p50, 10,000 runs (ms)", lambda r: r["claim_small"]["claim_p50_ms"]),
        (f"claim p50, {args.backlog:,} runs (ms)", lambda r: r["claim_large"]["claim_p50_ms"]),
        ("claim p50 ratio (target ≤ 1.2)", lambda r: r["claim_ratio_p50"]),
        ("claim p90, 10,000 runs (ms)", lambda r: r["claim_small"]["claim_p90_ms"]),
        (f"claim p90, {args.backlog:,} runs (ms)", lambda r: r["claim_large"]["claim_p90_ms"]),
    ]
    for label, value in rows:
        lines.append(
            f"| {label} | " + " | ".join(f"{value(r):.3g}" for r in results.values()) + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs per drain (2000)")
    parser.add_argument("--concurrency", "-c", type=int, default=16, help="worker slots (16)")
    parser.add_argument("--drain-keys", type=int, default=100, help="keys of the drain (100)")
    parser.add_argument("--limit", type=int, default=4, help="the limit of every key (4)")
    parser.add_argument("--backlog", type=int, default=1_000_000, help="runs for the claim")
    parser.add_argument("--keys", type=int, default=10_000, help="keys of that backlog")
    parser.add_argument("--samples", type=int, default=200, help="claims timed (200)")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg", default=os.environ.get("STEPTRAIL_BENCH_PG", DEFAULT_PG))
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="steptrail-keys-") as tmp:
        for backend in backends:
            results[backend] = measure(backend, args, Path(tmp))
    print(markdown(results, args))
    if args.json:
        report = {"config": {k: v for k, v in vars(args).items() if k != "json"}, **results}
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
