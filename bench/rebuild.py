"""Rebuild throughput of the reporting views: batched rebuild vs one transaction per event.

    python bench/rebuild.py [--runs 2000] [--single 1000] [--pg-url URL] [--json out.json]

Fills a fresh database per backend with runs (queued, claimed, a few steps, settled), then:
* rebuilds the reporting views from the whole log in batches (`steptrail rebuild reporting`),
* folds events one per transaction (`process_batch(1)`) for `--single` events,
and reports events per second of each and their ratio, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from typing import Any

import psycopg

from steptrail.domain.enums import TerminationReason
from steptrail.domain.run import Run
from steptrail.infrastructure.factory import open_store
from steptrail.infrastructure.reporting_store import PROJECTION, ReportingStore


def fill(store: Any, runs: int) -> int:
    """Create `runs` runs of 1 + 1 + 3 + 1 events each; returns the number of events."""
    for i in range(runs):
        run = Run.enqueue(run_id=uuid.uuid4(), agent="bench", request_digest="d", actor="b")
        store.create(run, request=b"{}")
        claimed = store.claim(holder="w", lease_ms=60_000, agents=["bench"]).run
        for k in range(3):
            claimed.record_step(kind="llm", name=f"s{k}", duration_ms=k, tokens=5)
        store.append(claimed)
        if i % 10 == 0:
            claimed.dead_letter(actor="w", reason=TerminationReason.NOT_RETRYABLE, cause="b")
        else:
            claimed.complete()
        store.append(claimed)
    return runs * 6


def measure(url: str, runs: int, single: int) -> dict[str, Any]:
    store = open_store(url)
    try:
        events = fill(store, runs)
        views = ReportingStore(store)
        started = time.perf_counter()
        views.rebuild(batch=5000)
        batched = events / (time.perf_counter() - started)
        with store.reporting_write() as tx:
            tx.run("clear_views", {"projection": PROJECTION})
        started = time.perf_counter()
        for _ in range(single):
            views.process_batch(1)
        one_by_one = single / (time.perf_counter() - started)
        return {
            "events": events,
            "batched_events_per_s": round(batched),
            "per_event_tx_events_per_s": round(one_by_one),
            "ratio": round(batched / one_by_one, 1),
        }
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--single", type=int, default=1000)
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = measure(f"sqlite:///{tmp}/bench.db", args.runs, args.single)
    name = f"steptrail_bench_rebuild_{uuid.uuid4().hex[:6]}"
    base = args.pg_url.rsplit("/", 1)[0]
    with psycopg.connect(args.pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        results["postgres"] = measure(f"{base}/{name}", args.runs, args.single)
    finally:
        with psycopg.connect(args.pg_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print("| backend | events | batched rebuild (events/s) | one tx per event (events/s) | ratio |")
    print("|---|---|---|---|---|")
    for backend, r in results.items():
        print(
            f"| {backend} | {r['events']} | {r['batched_events_per_s']} | "
            f"{r['per_event_tx_events_per_s']} | {r['ratio']}x |"
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
