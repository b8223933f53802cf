"""The console's runs page at 2k and at 200k runs: does a page cost the same at any size?

    python bench/console.py [--small 2000] [--large 200000] [--requests 30]
                            [--backends sqlite,postgres] [--pg URL] [--json out.json]

For each backend it fills a fresh database's reporting views with `--small` runs, times the
runs page, grows the same database to `--large` runs and times it again, in one invocation.
The rows go straight into the views with SQL (summaries and status counts, as the projector
would leave them; 10 % failed, 5 % waiting, the rest completed, over 30 days and 5 agents):
the page reads only the views, and writing 200k runs through the runtime would take hours
on this machine without changing what is measured.

Each figure is the median of `--requests` renders through the ASGI app in-process (routing,
SQL, template; no network), for the first page, a filtered page (status=failed), an agent's
page, and a deep page reached by the keyset link 20 pages down. The ratio large / small is
what the issue asks to be at most 3.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from steptrail.infrastructure.factory import open_store
from steptrail.infrastructure.settings import Settings
from steptrail.runtime import open_runtime

warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")

from starlette.testclient import TestClient  # noqa: E402 -- after the warning filter

from steptrail.console import ConsoleConfig, create_app  # noqa: E402

AGENTS = ("triage", "summarise", "billing", "support", "research")
PAGES = {
    "first page": {},
    "status=failed": {"status": "failed"},
    "agent=billing": {"agent": "billing"},
    "20 pages deep": None,  # reached by following `older »`
}


def state_json(run_id: uuid.UUID, agent: str, status: str, reason: str | None) -> str:
    return json.dumps(
        {
            "run_id": str(run_id),
            "agent": agent,
            "version": 6,
            "status": status,
            "reason": reason,
            "steps": 3,
            "tokens": 30,
            "cost": 0.0003,
            "request_digest": "sha256:" + "0" * 64,
        }
    )


def rows(n: int, start: int) -> list[dict[str, Any]]:
    rng = random.Random(start)
    now = datetime.now(UTC)
    out = []
    for i in range(start, start + n):
        run_id = uuid.uuid4()
        agent = AGENTS[i % len(AGENTS)]
        roll = rng.random()
        status, reason = "completed", "completed"
        if roll < 0.10:
            status, reason = "failed", "not_retryable"
        elif roll < 0.15:
            status, reason = "waiting_for_approval", None
        created = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
        ended = created + timedelta(seconds=3) if reason else None
        out.append(
            {
                "run_id": run_id,
                "agent": agent,
                "status": status,
                "reason": reason,
                "state": state_json(run_id, agent, status, reason),
                "created_at": created,
                "ended_at": ended,
            }
        )
    return out


def insert(url: str, batch: list[dict[str, Any]]) -> None:
    store = open_store(url)
    d = store
    try:
        params = [
            {
                "run_id": d.db_id(r["run_id"]),
                "agent": r["agent"],
                "status": r["status"],
                "reason": r["reason"],
                "state": r["state"]
                if url.startswith("sqlite")
                else psycopg.types.json.Jsonb(json.loads(r["state"])),
                "steps": 3,
                "step_ms": 30,
                "suspensions": 0,
                "created_at": d.db_time(r["created_at"]),
                "updated_at": d.db_time(r["ended_at"] or r["created_at"]),
                "ended_at": d.db_time(r["ended_at"]),
            }
            for r in batch
        ]
        counts: dict[tuple[str, str], int] = {}
        for r in batch:
            counts[(r["agent"], r["status"])] = counts.get((r["agent"], r["status"]), 0) + 1
        with store.reporting_write() as tx:
            for i in range(0, len(params), 5000):
                tx.many("upsert_summary", params[i : i + 5000])
            tx.many(
                "add_status_count",
                [{"agent": a, "status": s, "delta": n} for (a, s), n in counts.items()],
            )
        if not url.startswith("sqlite"):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ANALYZE steptrail_view_run_summaries")
    finally:
        store.close()


def time_pages(url: str, requests: int) -> dict[str, float]:
    settings = Settings(database_url=url, log_level="error")
    rt = open_runtime(settings=settings)
    try:
        client = TestClient(
            create_app(rt, ConsoleConfig(project=False)), base_url="http://127.0.0.1"
        )
        result = {}
        for name, params in PAGES.items():
            target = "/runs"
            query = params
            if params is None:
                query = {}
                for _ in range(20):
                    page = client.get(target, params=query).text
                    marker = 'rel="next"'
                    assert marker in page, "fewer than 21 pages: raise --small"
                    href = page.split(marker)[0].rsplit('href="', 1)[1].split('"')[0]
                    target, _, raw = href.replace("&amp;", "&").partition("?")
                    query = dict(p.split("=", 1) for p in raw.split("&") if p)
            client.get(target, params=query)  # warm the connection and the template
            samples = []
            for _ in range(requests):
                started = time.perf_counter()
                response = client.get(target, params=query)
                samples.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, response.text[:200]
                assert 'data-run="' in response.text
            result[name] = statistics.median(samples)
        return result
    finally:
        rt.close()


def pg_database(admin: str, name: str) -> str:
    with psycopg.connect(f"{admin}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{admin}/{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=2000)
    parser.add_argument("--large", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument(
        "--pg",
        default=os.environ.get("STEPTRAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432"),
    )
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    report: dict[str, Any] = {"small": args.small, "large": args.large, "backends": {}}
    with tempfile.TemporaryDirectory() as folder:
        for backend in args.backends.split(","):
            if backend == "sqlite":
                url = f"sqlite:///{folder}/console-bench.db"
            else:
                url = pg_database(args.pg, "steptrail_bench_console")
            open_store(url).close()
            insert(url, rows(args.small, 0))
            small = time_pages(url, args.requests)
            insert(url, rows(args.large - args.small, args.small))
            large = time_pages(url, args.requests)
            ratios = {k: large[k] / small[k] for k in small}
            report["backends"][backend] = {"small_ms": small, "large_ms": large, "ratio": ratios}
            print(f"{backend}: runs page, median of {args.requests} renders")
            for name in small:
                print(
                    f"  {name:<15} {args.small:>7} runs {small[name]:7.1f} ms   "
                    f"{args.large:>7} runs {large[name]:7.1f} ms   ratio {ratios[name]:.2f}"
                )
            if backend != "sqlite":
                with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as conn:
                    conn.execute('DROP DATABASE IF EXISTS "steptrail_bench_console" WITH (FORCE)')
    worst = max(r for b in report["backends"].values() for r in b["ratio"].values())
    report["worst_ratio"] = worst
    print(f"worst ratio {worst:.2f} (target: at most 3)")
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()
