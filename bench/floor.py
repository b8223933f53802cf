"""Where a PostgreSQL drain's time goes: steptrail's worker against its own statements and
against raw queues, in one invocation.

`bench/run.py` compares steptrail's drain with Procrastinate and with a raw `SKIP LOCKED`
loop. This script splits the gap. Every variant drains N no-op runs with the same shape
(P processes x C connections or slots, released together), and reports runs/s and the CPU
per run of the client processes and of the server's backends:

* ``raw``: a bare queue table, claim (`UPDATE … SKIP LOCKED … RETURNING`) then settle (one
  `UPDATE`): `bench/run.py`'s raw loop.
* ``raw_log``: the same queue with an event log, as any event-sourced queue needs: the
  claim also appends a Claimed event, the settle appends a step and a Completed event, fenced
  on the row's version. The floor of an event-sourced design on this server.
* ``raw_log_batched``: ``raw_log`` with one connection per process that claims up to C runs
  in one statement and settles them together in one: what batching settles (ADR 0038) buys
  where no client code runs between the statements.
* ``statements``: steptrail's schema and its own claim and settle statements (the
  `steptrail_claim` and `steptrail_append` functions), sent from C threads per process on
  their own connections, exactly as the store sends them (on kept cursors, ADR 0091), with
  parameters taken once from a real run of the `scripted` agent (one step, then complete);
  only the run id changes from run to run. No domain, worker or store code runs per run.
  Each settled run is checked to have the log a worker would have written (versions 1-4).
  One run per claim.
* ``statements_dispatched``: the same statements in the worker's shape: one connection per
  process claims for all free slots in one statement (up to C) and hands each run to one of
  C threads, which settles it on its own connection.
* ``worker``: `Runtime.worker(concurrency=C, burst=True).run()` in each process, as
  `bench/run.py` runs it (built before the start signal, as the other variants connect
  before it; ADR 0091).
* ``procrastinate``: Procrastinate 3.10 draining N no-op async tasks, as `bench/run.py`
  runs it (needs the `bench` extra).

And the step append the same way, K appends from one thread each:

* ``insert``: a bare single-row INSERT loop (autocommit): `bench/run.py`'s.
* ``append_statement``: steptrail's step-append statement (`append_one`, one event), sent K
  times for one claimed run with its parameters made once; only the expected version moves.
* ``append``: `Run.record_step` + `store.append`, as `bench/run.py` times it.

So ``statements / raw_log`` is what steptrail's schema and functions cost the server
(indexes, the run document, the fence), and ``worker / statements`` what the worker's code
costs per run, and ``statements / procrastinate`` how far ahead of Procrastinate steptrail
could be if its worker cost nothing. On a machine where the server shares the cores with the
workers, throughput follows total CPU per run.

    python bench/floor.py                       # N=3000, K=2000, 3 rounds: 1-2 minutes
    python bench/floor.py --runs 5000 --rounds 5 --json floor.json

Every round recreates each database; the order of the variants rotates from round to round
(`--variants` picks some; the ratios of those present are reported).
The databases (`steptrail_floor_*`) are dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from run import (
    AGENT,
    DB_PROCRASTINATE,
    DEFAULT_PG,
    PAYLOAD_BYTES,
    RAW_SCHEMA,
    BenchError,
    Config,
    RawQueueDrain,
    SteptrailDrain,
    ThreadedDrain,
    append_steps,
    bare_inserts,
    bench_procrastinate,
    check_postgres,
    claimed_run,
    drop_database,
    environment,
    quiet_logging,
    recreate_database,
    run_in_processes,
    settle,
    step_payload,
    steptrail_settings,
)

from steptrail.domain.enums import PrivacyLevel
from steptrail.domain.ports import ClaimRequest
from steptrail.domain.run import Run
from steptrail.infrastructure.pg_connections import execute_kept
from steptrail.infrastructure.postgres import PostgresRunStore, _claim_params
from steptrail.runtime import open_runtime
from steptrail.workers.holders import holder_name

DRAINS = (
    "raw",
    "raw_log",
    "raw_log_batched",
    "statements",
    "statements_dispatched",
    "worker",
    "procrastinate",
)
APPENDS = ("insert", "append_statement", "append")
VARIANTS = DRAINS + APPENDS
DB_PREFIX = "steptrail_floor_"

LOG_SCHEMA = """
ALTER TABLE bench_queue ADD COLUMN version integer NOT NULL DEFAULT 1;
CREATE TABLE bench_events (
    run_id bigint NOT NULL,
    version integer NOT NULL,
    topic text NOT NULL,
    state bytea NOT NULL,
    notification_id bigserial,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, version)
);
CREATE UNIQUE INDEX bench_events_notification_idx ON bench_events (notification_id);
"""
# Claim a run and append a Claimed event to it, in one statement.
_LOG_CLAIM = """
WITH c AS (
    UPDATE bench_queue SET status = 'running', holder = %(holder)s, updated_at = now(),
        version = version + 1
    WHERE id {} (
        SELECT id FROM bench_queue
        WHERE status = 'queued' AND available_at <= now()
        ORDER BY available_at, id
        LIMIT {}
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id, version
), e AS (
    INSERT INTO bench_events (run_id, version, topic, state)
    SELECT id, version, 'Claimed', %(claimed)s FROM c
)
SELECT id, version FROM c
"""
LOG_CLAIM = _LOG_CLAIM.format("=", "1")
LOG_CLAIM_MANY = _LOG_CLAIM.format("IN", "%(n)s")  # up to n runs
# Settle a run, fenced on its version, appending a step and a Completed event.
LOG_SETTLE = """
WITH u AS (
    UPDATE bench_queue SET status = 'done', updated_at = now(), version = version + 2
    WHERE id = %(id)s AND version = %(version)s
    RETURNING id, version
)
INSERT INTO bench_events (run_id, version, topic, state)
SELECT id, version - 1, 'StepRecorded', %(step)s FROM u
UNION ALL
SELECT id, version, 'Completed', %(completed)s FROM u
"""
# The same for several runs, each fenced on its own version.
LOG_SETTLE_MANY = """
WITH x AS (SELECT * FROM unnest(%(ids)s::bigint[], %(versions)s::integer[]) AS x(id, v)),
u AS (
    UPDATE bench_queue q SET status = 'done', updated_at = now(), version = q.version + 2
    FROM x WHERE q.id = x.id AND q.version = x.v
    RETURNING q.id, q.version
)
INSERT INTO bench_events (run_id, version, topic, state)
SELECT id, version - 1, 'StepRecorded', %(step)s FROM u
UNION ALL
SELECT id, version, 'Completed', %(completed)s FROM u
"""


def _payloads() -> dict[str, bytes]:
    return {
        "claimed": os.urandom(50),
        "step": os.urandom(PAYLOAD_BYTES),
        "completed": os.urandom(60),
    }


class LogDrain(ThreadedDrain):
    """raw_log: one run per claim, settled on its own."""

    def __init__(self, url: str, concurrency: int) -> None:
        super().__init__(url, concurrency)
        self.params = {"holder": holder_name("floor"), **_payloads()}

    def step(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(LOG_CLAIM, self.params, prepare=True).fetchone()
        if row is None:
            return 0
        settled = conn.execute(
            LOG_SETTLE, {**self.params, "id": row[0], "version": row[1]}, prepare=True
        )
        if settled.rowcount != 2:
            raise BenchError(f"run {row[0]} was not settled at version {row[1]}")
        return 1


class BatchedLogDrain(ThreadedDrain):
    """raw_log_batched: one connection per process claims up to C runs in one statement and
    settles them together in one."""

    def __init__(self, url: str, concurrency: int) -> None:
        super().__init__(url, 1)
        self.params = {"holder": holder_name("floor"), "n": concurrency, **_payloads()}

    def step(self, conn: psycopg.Connection[Any]) -> int:
        rows = conn.execute(LOG_CLAIM_MANY, self.params, prepare=True).fetchall()
        if not rows:
            return 0
        ids, versions = [r[0] for r in rows], [r[1] for r in rows]
        settled = conn.execute(
            LOG_SETTLE_MANY, {**self.params, "ids": ids, "versions": versions}, prepare=True
        )
        if settled.rowcount != 2 * len(rows):
            raise BenchError(f"runs {ids} were not all settled")
        return len(rows)


class StatementsDrain(ThreadedDrain):
    """statements: steptrail's claim and settle statements, parameters prepared once."""

    def __init__(self, url: str, concurrency: int, template: dict[str, Any]) -> None:
        super().__init__(url, concurrency)
        for conn in self.connections:
            conn.row_factory = dict_row  # type: ignore[assignment]
        self.t = template

    def step(self, conn: psycopg.Connection[Any]) -> int:
        rows = execute_kept(conn, self.t["claim_sql"], self.t["claim"]).fetchall()
        if not rows:
            return 0
        for row in rows:
            if row["version"] != self.t["settle"]["expected"]:
                raise BenchError(f"claimed run {row['run_id']} is at version {row['version']}")
            params = {**self.t["settle"], "run_id": row["run_id"]}
            execute_kept(conn, self.t["settle_sql"], params)
        return len(rows)


class DispatchedStatementsDrain:
    """statements_dispatched: the worker's shape without its code. One connection per
    process claims for the free slots in one statement (up to C, as `Worker.run` does) and
    hands each run to one of C threads, which settles it on its own connection."""

    def __init__(self, url: str, concurrency: int, template: dict[str, Any]) -> None:
        self.claimer = psycopg.connect(url, autocommit=True, connect_timeout=5)
        self.claimer.row_factory = dict_row  # type: ignore[assignment]
        self.settlers = [
            psycopg.connect(url, autocommit=True, connect_timeout=5) for _ in range(concurrency)
        ]
        self.t = template
        self.free = threading.Semaphore(concurrency)
        self.handed: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.settled = 0
        self.failed: list[str] = []
        self.lock = threading.Lock()

    def _settle(self, conn: psycopg.Connection[Any]) -> None:
        while (run_id := self.handed.get()) is not None:
            try:
                execute_kept(conn, self.t["settle_sql"], {**self.t["settle"], "run_id": run_id})
            except psycopg.Error as error:
                self.failed.append(str(error))
            with self.lock:
                self.settled += 1
            self.free.release()

    def work(self) -> dict[str, Any]:
        threads = [threading.Thread(target=self._settle, args=(c,)) for c in self.settlers]
        for thread in threads:
            thread.start()
        slots = len(self.settlers)
        try:
            while True:
                self.free.acquire()  # at least one slot is free; take the others that are
                free = 1
                while free < slots and self.free.acquire(blocking=False):
                    free += 1
                params = {**self.t["claim"], "limit": free}
                rows = execute_kept(self.claimer, self.t["claim_sql"], params).fetchall()
                for _ in range(free - len(rows)):
                    self.free.release()
                if not rows:
                    break
                for row in rows:
                    self.handed.put(row["run_id"])
        finally:
            for _ in threads:
                self.handed.put(None)
            for thread in threads:
                thread.join()
        if self.failed:
            raise BenchError(f"a settle failed: {self.failed[0]}")
        return {"done": self.settled}

    def close(self) -> None:
        for conn in (self.claimer, *self.settlers):
            conn.close()


def _record_step(run: Run, k: int) -> None:
    """Step k as the scripted agent records it (`bench/run.py`'s payload)."""
    run.record_step(
        kind="llm", name=f"think-{k}", duration_ms=0, payload=step_payload(k), tokens=10, cost=0
    )


def settle_template(url: str) -> dict[str, Any]:
    """Run one `scripted` run through the store (claim, one step, complete) and keep the
    statements and parameters it sent for its claim and its settle."""
    with open_runtime(settings=steptrail_settings(url)) as runtime:
        store = runtime.store
        if not isinstance(store, PostgresRunStore):
            raise BenchError("the statements variant needs the PostgreSQL store")
        run = claimed_run(runtime, 1)
        request = ClaimRequest(
            holder=run.state.holder or "", lease_ms=runtime.settings.lease_ms, agents=(AGENT,)
        )
        _record_step(run, 1)
        run.complete(result={"steps": 1}, privacy=PrivacyLevel.METADATA)
        name, params = store.append_statement(run)
        store.append(run)
        return {
            "claim_sql": store.q["claim"],
            "claim": _claim_params(request, prefix=""),
            "settle_sql": store.q[name],
            "settle": params,
        }


def enqueue(url: str, runs: int) -> None:
    """Queue `runs` no-op runs through steptrail (one statement per batch)."""
    with open_runtime(settings=steptrail_settings(url)) as runtime:
        runtime.enqueue_many([{"agent": AGENT, "request": {"steps": 1}}] * runs)


def _check_log(url: str, runs: int) -> None:
    """Every run the statements settled has the log a worker writes: completed at 4."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed' AND version = 4),"
            " (SELECT count(*) FROM steptrail_events) FROM steptrail_runs"
        ).fetchone()
    # The template run is settled too: runs + 1 runs of 4 events each.
    if row is None or row[0] != runs + 1 or row[1] != 4 * (runs + 1):
        raise BenchError(f"the statements variant left {row} completed runs/events")


def append_rate(variant: str, url: str, k: int) -> float:
    """Appends per second from one thread: a bare INSERT (`bench/run.py`'s), steptrail's
    step-append statement sent K times with its parameters made once (only the expected
    version moves), or `Run.record_step` + `store.append` as `bench/run.py` times them."""
    if variant == "insert":
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(RAW_SCHEMA)
            return bare_inserts(conn, k)
    with open_runtime(settings=steptrail_settings(url)) as runtime:
        if variant == "append":
            return append_steps(runtime, k)
        store = runtime.store
        if not isinstance(store, PostgresRunStore):
            raise BenchError("the append variants need the PostgreSQL store")
        run = claimed_run(runtime, 1)  # no agent runs it: its request does not matter
        _record_step(run, 1)
        name, params = store.append_statement(run)
        query, first = store.q[name], run.committed_version
        with psycopg.connect(url, autocommit=True) as conn:
            started = time.perf_counter()
            for i in range(k):
                params["expected"], params["version"] = first + i, first + i + 1
                execute_kept(conn, query, params)
            rate = k / (time.perf_counter() - started)
        moved = store.load(run.id)
        if moved is None or moved.version != first + k:
            raise BenchError("the append statement did not move the run to its last version")
        return rate


def one_variant(variant: str, cfg: Config) -> dict[str, float]:
    if variant in APPENDS:
        url = recreate_database(cfg.pg, DB_PREFIX + variant)
        return {"rate": append_rate(variant, url, cfg.appends)}
    if variant == "procrastinate":  # bench/run.py's drain, its defer rate left out
        figures = bench_procrastinate(recreate_database(cfg.pg, DB_PROCRASTINATE), cfg)
        return {k: v for k, v in figures.items() if k != "enqueue"}
    name = DB_PREFIX + variant
    template: dict[str, Any] | None = None  # the statements variants' claim and settle
    if variant in ("raw", "raw_log", "raw_log_batched"):
        url = recreate_database(cfg.pg, name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(RAW_SCHEMA)
            if variant != "raw":
                conn.execute(LOG_SCHEMA)
            with conn.cursor() as cur, cur.copy("COPY bench_queue (payload) FROM STDIN") as copy:
                for _ in range(cfg.runs):
                    copy.write_row((os.urandom(PAYLOAD_BYTES),))
        factory: Any = {"raw": RawQueueDrain, "raw_log": LogDrain}.get(variant, BatchedLogDrain)
        args: tuple[Any, ...] = (url, cfg.concurrency)
    else:
        url = recreate_database(cfg.pg, name)
        template = settle_template(url) if variant.startswith("statements") else None
        enqueue(url, cfg.runs)
        if template is None:
            factory, args = SteptrailDrain, (url, cfg.concurrency)
        else:
            drains = {
                "statements": StatementsDrain,
                "statements_dispatched": DispatchedStatementsDrain,
            }
            factory, args = drains[variant], (url, cfg.concurrency, template)
    settle(url, cfg)
    drain = run_in_processes(factory, args, cfg, database=name)
    done = sum(r["done"] for r in drain.reports)
    if done != cfg.runs:
        raise BenchError(f"{variant}: {done} of {cfg.runs} runs settled")
    if template is not None:
        _check_log(url, cfg.runs)
    return drain.figures(cfg.runs)


def summarise(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Medians of each variant's figures, and the median over rounds of each ratio."""
    figures = {
        v: {k: statistics.median(r[v][k] for r in rounds) for k in rounds[0][v]} for v in rounds[0]
    }
    pairs = [
        ("append_statement", "insert"),
        ("append", "insert"),
        ("append", "append_statement"),
        ("raw_log", "raw"),
        ("raw_log_batched", "raw_log"),
        ("statements", "raw_log"),
        ("statements", "raw"),
        ("statements_dispatched", "statements"),
        ("worker", "statements"),
        ("worker", "statements_dispatched"),
        ("worker", "raw"),
        ("statements", "procrastinate"),
        ("statements_dispatched", "raw"),
        ("statements_dispatched", "procrastinate"),
        ("worker", "procrastinate"),
    ]
    ratios = {}
    for a, b in pairs:
        if a in figures and b in figures:
            key = "rate" if a in APPENDS else "drain"
            per_round = [r[a][key] / r[b][key] for r in rounds]
            ratios[f"{a} / {b}"] = {
                "median": statistics.median(per_round),
                "min": min(per_round),
                "max": max(per_round),
            }
    return {"figures": figures, "ratios": ratios}


def markdown(summary: dict[str, Any], cfg: Config) -> str:
    lines = [
        f"N={cfg.runs} runs, P={cfg.processes} x C={cfg.concurrency}, {cfg.rounds} rounds",
        "",
        "| variant | runs/s | client CPU ms/run | server CPU ms/run | total |",
        "|---|---:|---:|---:|---:|",
    ]
    drains = {v: f for v, f in summary["figures"].items() if v in DRAINS}
    appends = {v: f for v, f in summary["figures"].items() if v in APPENDS}
    for variant, f in drains.items():
        server = f.get("server_cpu_ms")
        total = f.get("cpu_ms")
        lines.append(
            f"| {variant} | {f['drain']:,.0f} | {f['worker_cpu_ms']:.3f} | "
            f"{'-' if server is None else f'{server:.3f}'} | "
            f"{'-' if total is None else f'{total:.3f}'} |"
        )
    if appends:
        lines += ["", f"| appends from one thread (K={cfg.appends}) | per second |", "|---|---:|"]
        lines += [f"| {variant} | {f['rate']:,.0f} |" for variant, f in appends.items()]
    lines += ["", "| ratio | median | min - max |", "|---|---:|---:|"]
    for name, r in summary["ratios"].items():
        lines.append(f"| {name} | {r['median']:.2f}x | {r['min']:.2f} - {r['max']:.2f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        description="Split the PostgreSQL drain: raw queue, raw queue with an event log, "
        "steptrail's own statements, steptrail's worker (see the module docstring)."
    )
    parser.add_argument("--runs", "-n", type=int, default=3000, help="runs per drain")
    parser.add_argument("--processes", "-p", type=int, default=2)
    parser.add_argument("--concurrency", "-c", type=int, default=4)
    parser.add_argument("--rounds", "-r", type=int, default=3)
    parser.add_argument("--appends", "-k", type=int, default=2000, help="appends per variant")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {VARIANTS}"
    )
    parser.add_argument("--pg", default=os.environ.get("STEPTRAIL_BENCH_PG", DEFAULT_PG))
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if min(args.runs, args.processes, args.concurrency, args.rounds, args.appends) < 1:
        parser.error("--runs, --processes, --concurrency, --rounds, --appends must be >= 1")
    args.variants = variants
    cfg = Config(
        runs=args.runs,
        appends=args.appends,
        processes=args.processes,
        concurrency=args.concurrency,
        rounds=args.rounds,
        pg=args.pg.rstrip("/"),
        keep=False,
        cold_stats=False,
    )
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    quiet_logging()
    try:
        version = check_postgres(cfg.pg)
    except BenchError as error:
        print(error, file=sys.stderr)
        return 2
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        for index in range(cfg.rounds):
            shift = index % len(args.variants)
            order = args.variants[shift:] + args.variants[:shift]
            figures: dict[str, dict[str, float]] = {}
            for variant in order:
                started = time.monotonic()
                figures[variant] = one_variant(variant, cfg)
                rate = figures[variant].get("drain", figures[variant].get("rate", 0.0))
                print(
                    f"round {index + 1}/{cfg.rounds} {variant}: {rate:,.0f}/s "
                    f"({time.monotonic() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            rounds.append({v: figures[v] for v in args.variants})
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        for variant in VARIANTS:
            drop_database(cfg.pg, DB_PREFIX + variant)
        drop_database(cfg.pg, DB_PROCRASTINATE)
    summary = summarise(rounds)
    print(markdown(summary, cfg))
    if args.json:
        out = {"rounds": rounds, **summary, "environment": environment(version)}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
