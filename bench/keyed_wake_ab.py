"""What the keyed due index (migration 0038, ADR 0087) costs the claim and the drain: A/B in
one process, rounds interleaved.

    python bench/keyed_wake_ab.py                  # both backends, 4 rounds
    python bench/keyed_wake_ab.py --backend postgres --rounds 6

Each round makes two fresh databases per figure, one as migrated (A: with the index) and
one with `steptrail_runs_keyed_due_idx` dropped after the migrations (B: the schema before
0038 as the claim and the enqueue see it; nothing in either path reads the index). Rounds
alternate A, B, A, B, so the machine's drift (2 cores shared) falls on both.

* **Claim**: `--samples` claims of one run each against `--backlog` queued keyed runs over
  `--keys` keys (loaded by `keys.load_backlog`, one INSERT through the triggers, then
  analysed), as `bench/keys.py` does; both databases open side by side and their claims
  alternated in blocks of ten; p50 per round.
* **Drain**: `--runs` keyed runs over `--drain-keys` keys enqueued by `enqueue_many` and
  drained by one burst worker of `--concurrency` slots (`keys.drain`'s loop): runs/s. The
  enqueue writes the index's entries; the claim takes them out of it.

Reported: each round's figures, the median of each side and the ratio with / without.
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

from keys import bench_app, load_backlog
from waits import DEFAULT_PG, Databases

from steptrail.runtime import open_runtime

INDEX = "steptrail_runs_keyed_due_idx"


def drop_index(rt: Any) -> None:
    store = rt.store
    if store.backend == "sqlite":
        with store._write() as (cur, _):
            cur.execute(f"DROP INDEX {INDEX}")
        return
    with store._connection() as conn:
        conn.execute(f"DROP INDEX {INDEX}")


def claim_p50s(with_url: str, without_url: str, args: argparse.Namespace) -> dict[str, float]:
    """Claim p50 on both databases, open side by side, their claims alternated in blocks of
    ten (`--samples` each), so that the machine's drift falls on both alike."""
    runtimes = {
        "with": open_runtime(bench_app(args.limit), url=with_url, log_level="warning"),
        "without": open_runtime(bench_app(args.limit), url=without_url, log_level="warning"),
    }
    try:
        drop_index(runtimes["without"])
        for rt in runtimes.values():
            load_backlog(rt, args.backlog, args.keys, args.limit)
        timings: dict[str, list[float]] = {side: [] for side in runtimes}
        for block in range(args.samples // 10):
            for side in ("with", "without") if block % 2 == 0 else ("without", "with"):
                store = runtimes[side].store
                for _ in range(10):
                    started = time.perf_counter()
                    claimed = store.claim_batch(
                        holder="bench:ab", lease_ms=600_000, agents=["noop"], limit=1
                    )
                    timings[side].append(time.perf_counter() - started)
                    if len(claimed) != 1:
                        raise SystemExit(f"a claim took {len(claimed)} runs, not 1")
    finally:
        for rt in runtimes.values():
            rt.close()
    return {side: 1000 * statistics.median(values) for side, values in timings.items()}


def drain_rate(url: str, with_index: bool, args: argparse.Namespace) -> float:
    with open_runtime(bench_app(args.limit), url=url, log_level="warning") as rt:
        if not with_index:
            drop_index(rt)
        rt.enqueue_many([{"agent": "noop"}] * 50)  # warm up: connections, plans, caches
        rt.work(burst=True, concurrency=args.concurrency)
        items = [
            {"agent": "noop", "concurrency_key": f"k:{n % args.drain_keys}"}
            for n in range(args.runs)
        ]
        started = time.perf_counter()
        rt.enqueue_many(items)
        report = rt.work(burst=True, concurrency=args.concurrency)
        elapsed = time.perf_counter() - started
        if report.outcomes.get("completed") != args.runs:
            raise SystemExit(f"the drain completed {report.outcomes}, not {args.runs}")
    return args.runs / elapsed


def measure(backend: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    sides: dict[str, dict[str, list[float]]] = {
        side: {"claim_p50_ms": [], "enqueue_drain_runs_s": []} for side in ("with", "without")
    }
    dbs = Databases(backend, args.pg, folder)
    try:
        for n in range(args.rounds):
            for side, p50 in claim_p50s(dbs.new(), dbs.new(), args).items():
                sides[side]["claim_p50_ms"].append(p50)
            order = ("with", "without") if n % 2 == 0 else ("without", "with")
            for side in order:
                sides[side]["enqueue_drain_runs_s"].append(
                    drain_rate(dbs.new(), side == "with", args)
                )
            print(f"{backend}: round {n + 1} done", file=sys.stderr)
    finally:
        dbs.drop()
    medians = {
        side: {name: statistics.median(values) for name, values in figures.items()}
        for side, figures in sides.items()
    }
    return {
        "rounds": sides,
        "median": medians,
        "claim_p50_ratio": medians["with"]["claim_p50_ms"] / medians["without"]["claim_p50_ms"],
        "drain_ratio": medians["with"]["enqueue_drain_runs_s"]
        / medians["without"]["enqueue_drain_runs_s"],
    }


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| figure (median of rounds) | " + " | ".join(results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    rows = [
        ("claim p50 with the index (ms)", lambda r: r["median"]["with"]["claim_p50_ms"]),
        ("claim p50 without (ms)", lambda r: r["median"]["without"]["claim_p50_ms"]),
        ("claim ratio with / without", lambda r: r["claim_p50_ratio"]),
        ("enqueue + drain with (runs/s)", lambda r: r["median"]["with"]["enqueue_drain_runs_s"]),
        (
            "enqueue + drain without (runs/s)",
            lambda r: r["median"]["without"]["enqueue_drain_runs_s"],
        ),
        ("drain ratio with / without", lambda r: r["drain_ratio"]),
    ]
    for label, value in rows:
        lines.append(
            f"| {label} | " + " | ".join(f"{value(r):.3g}" for r in results.values()) + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds, sides alternating (4)")
    parser.add_argument("--backlog", type=int, default=100_000, help="keyed runs queued (100k)")
    parser.add_argument("--keys", type=int, default=1_000, help="keys of that backlog (1000)")
    parser.add_argument("--samples", type=int, default=200, help="claims timed (200)")
    parser.add_argument("--runs", type=int, default=2000, help="runs per drain (2000)")
    parser.add_argument("--drain-keys", type=int, default=100, help="keys of the drain (100)")
    parser.add_argument("--limit", type=int, default=4, help="the limit of every key (4)")
    parser.add_argument("--concurrency", "-c", type=int, default=16, help="worker slots (16)")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg", default=os.environ.get("STEPTRAIL_BENCH_PG", DEFAULT_PG))
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="steptrail-keyed-ab-") as tmp:
        for backend in backends:
            results[backend] = measure(backend, args, Path(tmp))
    print(markdown(results))
    if args.json:
        report = {"config": {k: v for k, v in vars(args).items() if k != "json"}, **results}
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
