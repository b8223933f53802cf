"""steptrail benchmark: no-op run throughput and step-append rate, against raw SQL and
Procrastinate, all measured in one invocation so that the ratios compare like with like.

    python bench/run.py --quick                 # about 3 minutes
    python bench/run.py                         # about 10 minutes, 5 rounds
    python bench/run.py --processes 2 --concurrency 4 --runs 2000 --json out.json

What is measured (see bench/README.md for the meaning of every figure):

* steptrail drain: N runs of the built-in `scripted` agent with `{"steps": 1}` are enqueued
  (one thread, timed: the enqueue rate), then P worker processes each build
  `Runtime.worker(concurrency=C, burst=True)` and, from the start signal, run it until
  nothing is left (timed: runs/s; the worker's start is inside the clock, ADR 0091).
  On SQLite (a file in a temporary folder) and on PostgreSQL.
* steptrail appends: one run claimed, then K x (`Run.record_step` + `store.append`).
* raw PostgreSQL: a bare queue table drained with `FOR UPDATE SKIP LOCKED` claim + settle in
  P processes x C threads, and a bare single-row INSERT loop; a bare SQLite INSERT loop.
* Procrastinate: N no-op tasks deferred one by one, then drained by P processes each running
  a worker with `concurrency=C` and `wait=False`.
* Wire cost (PostgreSQL only, bench/wire.py): a counting proxy in front of the server tells
  how many sync points (ReadyForQuery messages) and COMMITs an enqueue, a claim, an append cost.
* Peers (bench/peers.py): steptrail and DBOS 3.4.0 drain the same no-op and five-step runs,
  one process of C slots each, on PostgreSQL and SQLite; part of every round.
* Latency (bench/latency.py, once at the end): enqueue -> start, a step's record, approve ->
  resume on an idle worker, p50/p99. bench/report.py prints the tables.

Every round recreates the databases, so rounds start from the same state; each figure is the
median over rounds and each ratio the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing as mp
import os
import queue
import resource
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

# Before steptrail reads its settings (workers read them from the environment as well).
os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")
# The wire-counting proxy parses the protocol from the first byte; keep libpq from opening
# with an SSL or GSS negotiation (the server is local and has SSL off anyway).
os.environ.setdefault("PGSSLMODE", "disable")
os.environ.setdefault("PGGSSENCMODE", "disable")

import psycopg
from psycopg import sql
from report import environment, latency_table, load_average, markdown, ratios, summarise

from steptrail.domain.enums import PrivacyLevel
from steptrail.domain.privacy import filter_payload
from steptrail.domain.run import Run
from steptrail.infrastructure.logging import configure_logging
from steptrail.infrastructure.settings import Settings
from steptrail.runtime import Runtime, open_runtime
from steptrail.workers.context import jsonable
from steptrail.workers.holders import holder_name

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432"
DB_STEPTRAIL = "steptrail_bench_pg"
DB_RAW = "steptrail_bench_raw"
DB_PROCRASTINATE = "procrastinate_bench"
AGENT = "scripted"
REQUEST = {"steps": 1}
STARTUP_TIMEOUT_S = 120.0
PAYLOAD_BYTES = 200  # the raw baselines' row payload, about one encoded step event
# The other scripts' databases (bench/peers.py, bench/latency.py), dropped at the end too.
PEER_DATABASES = ("steptrail_bench_peer", "dbos_bench", "steptrail_bench_latency")


class BenchError(RuntimeError):
    """The benchmark cannot go on (database unreachable, a worker failed, a drain hung)."""


def quiet_logging() -> None:
    """steptrail at warning level (its info lines would dominate), Procrastinate likewise."""
    configure_logging("json", os.environ.get("STEPTRAIL_LOG_LEVEL", "warning"))
    logging.basicConfig(level=logging.WARNING)
    # "App is instantiated in the main Python module": true, and harmless here.
    logging.getLogger("procrastinate").setLevel(logging.ERROR)


def steptrail_settings(url: str) -> Settings:
    return Settings(database_url=url, log_level="warning", poll_interval=0.1)


def step_payload(k: int) -> dict[str, Any]:
    """What the scripted agent records for step k, filtered as the worker filters it."""
    body = {
        "messages": [{"role": "user", "content": f"step {k}"}],
        "round": k,
        "content": f"thought {k}",
    }
    result: dict[str, Any] = filter_payload(jsonable(body), PrivacyLevel.METADATA)
    return result


# -- PostgreSQL administration -------------------------------------------------------------------


def pg_url(base: str, database: str) -> str:
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, ""))


def check_postgres(base: str) -> str:
    """The server's version; a clear BenchError when it cannot be reached."""
    try:
        with psycopg.connect(pg_url(base, "postgres"), connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.OperationalError as error:
        raise BenchError(
            f"PostgreSQL is unreachable at {base}: {str(error).strip().splitlines()[0]}\n"
            "start it (e.g. ./scripts/ensure-postgres) or pass --pg postgresql://user@host:port"
        ) from error
    return str(row[0]) if row else "?"


def recreate_database(base: str, name: str, template: str | None = None) -> str:
    """Drop `name` if it exists and create it, empty or as a copy of `template`."""
    with psycopg.connect(pg_url(base, "postgres"), autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(create)
    return pg_url(base, name)


def drop_database(base: str, name: str) -> None:
    try:
        with psycopg.connect(pg_url(base, "postgres"), autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    except psycopg.Error as error:
        print(f"warning: could not drop database {name}: {error}", file=sys.stderr)


def settle(url: str, cfg: Config) -> None:
    """Before a timed drain: give the planner statistics (what autovacuum or a DBA would
    have done on a live system; skipped with --cold-stats) and flush dirty pages, so that
    neither a missing ANALYZE nor a checkpoint lands inside one system's timing only."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            if not cfg.cold_stats:
                conn.execute("ANALYZE")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        return
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        if not cfg.cold_stats:
            conn.execute("ANALYZE")
        # Not a superuser: no checkpoint, and the timing is only noisier.
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")


# -- running a timed phase in P processes -------------------------------------------------------


class Phase(Protocol):
    """One worker process's part of a timed drain: set up in __init__ (untimed), `work()`
    (timed, returns what it did), `close()` (untimed)."""

    def work(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


def _child(
    factory: Callable[..., Phase],
    args: tuple[Any, ...],
    signals: tuple[Any, Any, Any],
    results: Any,
) -> None:
    ready, go, release = signals
    quiet_logging()
    phase: Phase | None = None
    try:
        phase = factory(*args)
        ready.wait(STARTUP_TIMEOUT_S)
        go.wait()
        before = _own_cpu_s()
        outcome = phase.work()
        t_end = time.monotonic()
        results.put({**outcome, "t_end": t_end, "cpu_s": _own_cpu_s() - before})
        # Keep the connections (and so the server backends) until the parent has read the
        # server's CPU counters.
        release.wait(STARTUP_TIMEOUT_S)
    except threading.BrokenBarrierError:
        results.put({"error": "another process failed to start"})
    except BaseException as error:
        results.put({"error": f"{type(error).__name__}: {error}"})
        ready.abort()
    finally:
        if phase is not None:
            phase.close()


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def backend_cpu_s(database: str | None) -> float | None:
    """CPU seconds used so far by the PostgreSQL backends serving `database`, read from
    /proc (None when the server is not on this machine or not visible)."""
    if database is None:
        return None
    marker = f" {database} ".encode()
    ticks = os.sysconf("SC_CLK_TCK")
    total, seen = 0, False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes()
            if not title.startswith(b"postgres:") or marker not in title:
                continue
            fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
        except OSError:
            continue  # the process exited meanwhile
        total += int(fields[11]) + int(fields[12])  # utime, stime
        seen = True
    return total / ticks if seen else None


@dataclass(frozen=True)
class Drain:
    """A timed drain: wall time, what each process reported, and CPU spent on it."""

    elapsed_s: float
    reports: list[dict[str, Any]]
    worker_cpu_s: float
    server_cpu_s: float | None

    def figures(self, n: int) -> dict[str, float]:
        out = {"drain": n / self.elapsed_s, "worker_cpu_ms": self.worker_cpu_s / n * 1000}
        if self.server_cpu_s is not None:
            out["server_cpu_ms"] = self.server_cpu_s / n * 1000
            out["cpu_ms"] = out["worker_cpu_ms"] + out["server_cpu_ms"]
        return out


def run_in_processes(
    factory: Callable[..., Phase],
    args: tuple[Any, ...],
    cfg: Config,
    *,
    database: str | None = None,
) -> Drain:
    """Start P processes that each build `factory(*args)`; once all are ready, let them work
    together. The wall time runs from the start signal until the last one finished; the
    server CPU is that of the backends serving `database` (PostgreSQL on this machine)."""
    ctx = mp.get_context("spawn")
    signals = (ctx.Barrier(cfg.processes + 1), ctx.Event(), ctx.Event())
    ready, go, release = signals
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(factory, args, signals, results), daemon=True)
        for _ in range(cfg.processes)
    ]
    name = factory.__name__
    timeout = max(120.0, cfg.runs / 10)
    for proc in procs:
        proc.start()
    try:
        try:
            ready.wait(STARTUP_TIMEOUT_S)
        except threading.BrokenBarrierError:
            reports = _drain_queue(results, len(procs), timeout=5)
            errors = [r["error"] for r in reports if "error" in r] or ["start-up timed out"]
            raise BenchError(f"{name}: a worker process failed: {errors[0]}") from None
        server_before = backend_cpu_s(database)
        started = time.monotonic()
        go.set()
        reports = _drain_queue(results, len(procs), timeout=timeout)
        server_after = backend_cpu_s(database)
        release.set()
        if len(reports) < len(procs):
            raise BenchError(f"{name}: the drain did not finish within {timeout:.0f}s")
        errors = [r["error"] for r in reports if "error" in r]
        if errors:
            raise BenchError(f"{name}: a worker process failed: {errors[0]}")
        for proc in procs:
            proc.join(timeout=30)
        server_cpu = None
        if server_before is not None and server_after is not None:
            server_cpu = server_after - server_before
        return Drain(
            elapsed_s=max(r["t_end"] for r in reports) - started,
            reports=reports,
            worker_cpu_s=sum(r["cpu_s"] for r in reports),
            server_cpu_s=server_cpu,
        )
    finally:
        release.set()
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)


def _drain_queue(results: Any, expected: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    reports: list[dict[str, Any]] = []
    while len(reports) < expected:
        try:
            reports.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            break
    return reports


# -- steptrail -----------------------------------------------------------------------------------


class SteptrailDrain:
    """One worker process: `Runtime.worker(concurrency=C, burst=True).run()`. The worker is
    built before the start signal and run after it, as DBOS is launched before its clock
    starts and the statements variants connect before theirs (ADR 0091): the clock times
    the drain, with the worker's start (its connections, its first claim) in it."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.runtime = open_runtime(settings=steptrail_settings(url))
        self.worker = self.runtime.worker(concurrency=concurrency, burst=True)

    def work(self) -> dict[str, Any]:
        report = self.worker.run()
        return {
            "done": report.outcomes.get("completed", 0),
            "claimed": report.claimed,
            "outcomes": dict(report.outcomes),
        }

    def close(self) -> None:
        self.runtime.close()


def enqueue_runs(runtime: Runtime, n: int) -> float:
    """Enqueue n no-op runs from one thread; returns runs/s."""
    started = time.perf_counter()
    for _ in range(n):
        runtime.enqueue(AGENT, REQUEST)
    return n / (time.perf_counter() - started)


def claimed_run(runtime: Runtime, steps: int) -> Run:
    """A run of the `scripted` agent asking for `steps` steps, enqueued and claimed."""
    runtime.enqueue(AGENT, {"steps": steps})
    claimed = runtime.store.claim(
        holder=holder_name("bench"), lease_ms=runtime.settings.lease_ms, agents=[AGENT]
    )
    if claimed is None:
        raise BenchError("the run just enqueued could not be claimed")
    return claimed.run


def append_steps(runtime: Runtime, k: int) -> float:
    """Claim one run, then time k x (record_step + store.append); returns appends/s."""
    run = claimed_run(runtime, k)
    payloads = [step_payload(i) for i in range(1, k + 1)]
    started = time.perf_counter()
    for i, payload in enumerate(payloads, start=1):
        run.record_step(
            kind="llm", name=f"think-{i}", duration_ms=0, payload=payload, tokens=10, cost=0.0001
        )
        runtime.store.append(run)
    rate = k / (time.perf_counter() - started)
    run.complete(result={"steps": k}, privacy=PrivacyLevel.METADATA)
    runtime.store.append(run)
    return rate


def bench_steptrail(url: str, cfg: Config) -> dict[str, float]:
    """Enqueue rate, drain rate and append rate of steptrail on the database at `url`."""
    with open_runtime(settings=steptrail_settings(url)) as runtime:
        enqueue_rate = enqueue_runs(runtime, cfg.runs)
    settle(url, cfg)
    database = None if url.startswith("sqlite:") else DB_STEPTRAIL
    drain = run_in_processes(SteptrailDrain, (url, cfg.concurrency), cfg, database=database)
    _check_done(f"steptrail {url.split(':', 1)[0]}", drain.reports, cfg.runs)
    with open_runtime(settings=steptrail_settings(url)) as runtime:
        append_rate = append_steps(runtime, cfg.appends)
    return {"enqueue": enqueue_rate, **drain.figures(cfg.runs), "append": append_rate}


def _check_done(what: str, reports: list[dict[str, Any]], expected: int) -> None:
    done = sum(r["done"] for r in reports)
    if done != expected:
        detail = [r.get("outcomes", r.get("done")) for r in reports]
        raise BenchError(f"{what}: {done} of {expected} runs completed; workers report {detail}")


# -- raw SQL baselines ---------------------------------------------------------------------------

RAW_SCHEMA = """
CREATE TABLE bench_queue (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'queued',
    payload bytea NOT NULL,
    holder text,
    available_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX bench_queue_claimable_idx ON bench_queue (available_at, id) WHERE status = 'queued';
CREATE TABLE bench_insert (
    id bigserial PRIMARY KEY,
    run_id uuid NOT NULL,
    version bigint NOT NULL,
    payload bytea NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
"""
RAW_CLAIM = """
UPDATE bench_queue SET status = 'running', holder = %(holder)s, updated_at = now()
WHERE id = (
    SELECT id FROM bench_queue
    WHERE status = 'queued' AND available_at <= now()
    ORDER BY available_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING id, payload
"""
RAW_SETTLE = "UPDATE bench_queue SET status = 'done', updated_at = now() WHERE id = %(id)s"
RAW_ENQUEUE = "INSERT INTO bench_queue (payload) VALUES (%(payload)s)"
RAW_INSERT = (
    "INSERT INTO bench_insert (run_id, version, payload) VALUES (%(run_id)s, %(v)s, %(payload)s)"
)


class ThreadedDrain:
    """One process of C threads, each looping `step(conn)` on its own autocommit connection
    until it returns 0; `work` reports how many runs they settled."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.connections = [
            psycopg.connect(url, autocommit=True, connect_timeout=5) for _ in range(concurrency)
        ]

    def step(self, conn: psycopg.Connection[Any]) -> int:
        """Claim and settle; the number of runs settled (0: nothing was left)."""
        raise NotImplementedError

    def _loop(self, conn: psycopg.Connection[Any], counts: list[int]) -> None:
        done = 0
        while settled := self.step(conn):
            done += settled
        counts.append(done)

    def work(self) -> dict[str, Any]:
        counts: list[int] = []
        threads = [
            threading.Thread(target=self._loop, args=(conn, counts)) for conn in self.connections
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if len(counts) != len(threads):
            raise BenchError(f"a {type(self).__name__} thread died")
        return {"done": sum(counts)}

    def close(self) -> None:
        for conn in self.connections:
            conn.close()


class RawQueueDrain(ThreadedDrain):
    """C threads looping claim (one statement, SKIP LOCKED) → settle (one statement) until
    the queue is empty."""

    def __init__(self, url: str, concurrency: int) -> None:
        super().__init__(url, concurrency)
        self.holder = holder_name("raw")

    def step(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(RAW_CLAIM, {"holder": self.holder}, prepare=True).fetchone()
        if row is None:
            return 0
        conn.execute(RAW_SETTLE, {"id": row[0]}, prepare=True)
        return 1


def bench_raw_postgres(url: str, cfg: Config) -> dict[str, float]:
    payload = os.urandom(PAYLOAD_BYTES)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW_SCHEMA)
        started = time.perf_counter()
        for _ in range(cfg.runs):
            conn.execute(RAW_ENQUEUE, {"payload": payload}, prepare=True)
        enqueue_rate = cfg.runs / (time.perf_counter() - started)
    settle(url, cfg)
    drain = run_in_processes(RawQueueDrain, (url, cfg.concurrency), cfg, database=DB_RAW)
    _check_done("raw SKIP LOCKED", drain.reports, cfg.runs)
    with psycopg.connect(url, autocommit=True) as conn:
        insert_rate = bare_inserts(conn, cfg.appends)
    return {"enqueue": enqueue_rate, **drain.figures(cfg.runs), "insert": insert_rate}


def bare_inserts(conn: psycopg.Connection[Any], k: int) -> float:
    """k single-row INSERTs of a ~200-byte payload into `bench_insert` (RAW_SCHEMA), each
    its own transaction (`conn` in autocommit); returns inserts/s."""
    payload = os.urandom(PAYLOAD_BYTES)
    run_id = uuid4()
    started = time.perf_counter()
    for v in range(1, k + 1):
        conn.execute(RAW_INSERT, {"run_id": run_id, "v": v, "payload": payload}, prepare=True)
    return k / (time.perf_counter() - started)


def bench_raw_sqlite(path: Path, k: int) -> float:
    """Single-row INSERTs, each its own transaction, with steptrail's durability settings
    (WAL, synchronous=NORMAL); returns inserts/s."""
    payload = os.urandom(PAYLOAD_BYTES)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE bench_insert (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, "
            "version INTEGER, payload BLOB, recorded_at INTEGER)"
        )
        run_id = uuid4().hex
        started = time.perf_counter()
        for v in range(1, k + 1):
            conn.execute(
                "INSERT INTO bench_insert (run_id, version, payload, recorded_at) "
                "VALUES (?, ?, ?, ?)",
                (run_id, v, payload, time.time_ns() // 1000),
            )
        return k / (time.perf_counter() - started)
    finally:
        conn.close()


# -- Procrastinate -------------------------------------------------------------------------------


def procrastinate_app(url: str) -> Any:
    """A Procrastinate app with a no-op task (named explicitly, so the spawned workers,
    which import this file under another module name, know it by the same name)."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="bench_noop")
    async def noop() -> None:
        return None

    return app


class ProcrastinateDrain:
    """One process: an opened app, then `run_worker_async(wait=False, concurrency=C)`."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.app = procrastinate_app(url)
        self.concurrency = concurrency
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.app.open_async())

    def work(self) -> dict[str, Any]:
        self.loop.run_until_complete(
            self.app.run_worker_async(
                wait=False, concurrency=self.concurrency, install_signal_handlers=False
            )
        )
        return {"done": 0}  # counted from the database afterwards

    def close(self) -> None:
        self.loop.run_until_complete(self.app.close_async())
        self.loop.close()


def bench_procrastinate(url: str, cfg: Config) -> dict[str, float]:
    app = procrastinate_app(url)
    noop = app.tasks["bench_noop"]
    with app.open():
        app.schema_manager.apply_schema()
        started = time.perf_counter()
        for _ in range(cfg.runs):
            noop.defer()
        defer_rate = cfg.runs / (time.perf_counter() - started)
    settle(url, cfg)
    drain = run_in_processes(
        ProcrastinateDrain, (url, cfg.concurrency), cfg, database=DB_PROCRASTINATE
    )
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()
    done = int(row[0]) if row else 0
    if done != cfg.runs:
        raise BenchError(f"procrastinate: {done} of {cfg.runs} jobs succeeded")
    return {"enqueue": defer_rate, **drain.figures(cfg.runs)}


# -- orchestration -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    runs: int
    appends: int
    processes: int
    concurrency: int
    rounds: int
    pg: str
    keep: bool
    cold_stats: bool
    # bench/peers.py: DBOS and steptrail, no-op and five-step, N = peer_runs each.
    peers: bool = False
    peer_runs: int = 200
    dbos_poll: float = 0.01
    # bench/latency.py, once after the rounds.
    latency: bool = False
    latency_samples: int = 200


def one_round(cfg: Config, folder: Path, index: int) -> dict[str, float]:
    """Every system once, from fresh databases. The order rotates from round to round so
    that no system always runs first (on a cold server) or last (after the others' WAL)."""

    def steptrail_sqlite() -> dict[str, float]:
        url = f"sqlite:///{folder / f'steptrail-{index}.db'}"
        figures = {f"steptrail_sqlite_{k}": v for k, v in bench_steptrail(url, cfg).items()}
        figures["raw_sqlite_insert"] = bench_raw_sqlite(folder / f"raw-{index}.db", cfg.appends)
        return figures

    def steptrail_pg() -> dict[str, float]:
        url = recreate_database(cfg.pg, DB_STEPTRAIL)
        return {f"steptrail_pg_{k}": v for k, v in bench_steptrail(url, cfg).items()}

    def raw_pg() -> dict[str, float]:
        url = recreate_database(cfg.pg, DB_RAW)
        return {f"raw_pg_{k}": v for k, v in bench_raw_postgres(url, cfg).items()}

    def procrastinate() -> dict[str, float]:
        url = recreate_database(cfg.pg, DB_PROCRASTINATE)
        return {f"procrastinate_{k}": v for k, v in bench_procrastinate(url, cfg).items()}

    def peers_pg() -> dict[str, float]:
        import peers  # here, not at the top: peers.py imports this file

        return peers.peer_figures(cfg, folder, index, "pg")

    def peers_sqlite() -> dict[str, float]:
        import peers

        return peers.peer_figures(cfg, folder, index, "sqlite")

    systems: list[Callable[[], dict[str, float]]] = [
        steptrail_pg,
        procrastinate,
        raw_pg,
        steptrail_sqlite,
    ]
    if cfg.peers:
        systems[1:1] = [peers_pg]
        systems.append(peers_sqlite)
    shift = index % len(systems)
    out: dict[str, float] = {}
    for system in systems[shift:] + systems[:shift]:
        out.update(system())
    out.update(ratios(out))
    return out


def parse_args(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--quick", action="store_true", help="N=1000, K=500, 2 rounds, 100 peer runs, 50 samples"
    )
    parser.add_argument("--runs", type=int, help="N runs/jobs per drain (2000; quick 1000)")
    parser.add_argument("--appends", type=int, help="K appends/inserts (1000; quick 500)")
    parser.add_argument("--rounds", type=int, help="rounds, each from fresh databases (5; quick 2)")
    parser.add_argument("--processes", "-p", type=int, default=2, help="worker processes P (2)")
    parser.add_argument("--concurrency", "-c", type=int, default=4, help="per process C (4)")
    parser.add_argument(
        "--pg",
        default=os.environ.get("STEPTRAIL_BENCH_PG", DEFAULT_PG),
        help=f"PostgreSQL server URL without database ({DEFAULT_PG})",
    )
    parser.add_argument(
        "--cold-stats",
        action="store_true",
        help="do not ANALYZE before the drains (planner without statistics, as right after "
        "a burst of enqueues into a new table)",
    )
    parser.add_argument("--no-wire", action="store_true", help="skip the wire-cost count")
    parser.add_argument(
        "--no-peers", action="store_true", help="skip DBOS and the peer drains (bench/peers.py)"
    )
    parser.add_argument(
        "--peer-runs", type=int, help="N runs/workflows per peer drain (200; quick 100)"
    )
    parser.add_argument(
        "--dbos-poll",
        type=float,
        default=0.01,
        help="DBOS queue polling_interval_sec in the peer drains (0.01)",
    )
    parser.add_argument(
        "--no-latency", action="store_true", help="skip the latency figures (bench/latency.py)"
    )
    parser.add_argument(
        "--latency-samples", type=int, help="samples per latency figure (200; quick 50)"
    )
    parser.add_argument(
        "--latency-only",
        action="store_true",
        help="only the latency figures (no drains, peers or wire cost)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the databases afterwards")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    cfg = Config(
        runs=args.runs or (1000 if args.quick else 2000),
        appends=args.appends or (500 if args.quick else 1000),
        rounds=args.rounds or (2 if args.quick else 5),
        processes=args.processes,
        concurrency=args.concurrency,
        pg=args.pg.rstrip("/"),
        keep=args.keep,
        cold_stats=args.cold_stats,
        peers=not args.no_peers,
        peer_runs=args.peer_runs or (100 if args.quick else 200),
        dbos_poll=args.dbos_poll,
        latency=not args.no_latency,
        latency_samples=args.latency_samples or (50 if args.quick else 200),
    )
    counts = (cfg.runs, cfg.appends, cfg.rounds, cfg.processes, cfg.concurrency, cfg.peer_runs)
    if min(*counts, cfg.latency_samples) < 1:
        parser.error("every count must be at least 1")
    if args.latency_only and args.no_latency:
        parser.error("--latency-only and --no-latency exclude each other")
    if cfg.dbos_poll <= 0:
        parser.error("--dbos-poll must be positive")
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    quiet_logging()
    started = time.monotonic()
    load_before = load_average()
    try:
        pg_version = check_postgres(cfg.pg)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(
        f"PostgreSQL {pg_version} at {cfg.pg}; {os.cpu_count()} CPUs; "
        f"P={cfg.processes} C={cfg.concurrency} N={cfg.runs} K={cfg.appends} "
        f"rounds={cfg.rounds}",
        file=sys.stderr,
    )
    rounds: list[dict[str, float]] = []
    wire: dict[str, float] = {}
    latency: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="steptrail-bench-") as tmp:
            for i in range(0 if args.latency_only else cfg.rounds):
                t = time.monotonic()
                rounds.append(one_round(cfg, Path(tmp), i))
                print(
                    f"round {i + 1}/{cfg.rounds} done in {time.monotonic() - t:.0f}s",
                    file=sys.stderr,
                )
            if cfg.latency:
                import latency as latency_bench  # here: latency.py imports this file

                t = time.monotonic()
                latency = latency_bench.measure(cfg, Path(tmp))
                print(f"latency done in {time.monotonic() - t:.0f}s", file=sys.stderr)
        if not (args.no_wire or args.latency_only):
            from wire import wire_costs  # here: wire.py imports this file

            wire = wire_costs(recreate_database(cfg.pg, DB_STEPTRAIL))
    except (BenchError, psycopg.Error) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        if not cfg.keep:
            for name in (DB_STEPTRAIL, DB_RAW, DB_PROCRASTINATE, *PEER_DATABASES):
                drop_database(cfg.pg, name)
    summary = summarise(rounds) if rounds else {}
    load = f"{load_before}/{load_average()}"
    if args.latency_only:
        print(f"1-min load average before/after: {load}")
        print("\n".join(latency_table(latency)))
    else:
        print(markdown(summary, wire, cfg, load, latency))
    print(f"\n(total {time.monotonic() - started:.0f}s)", file=sys.stderr)
    if args.json:
        report = {
            "config": asdict(cfg),
            "environment": {**environment(pg_version), "load_average": load},
            "dbos_poll_s": cfg.dbos_poll if cfg.peers else None,
            "rounds": rounds,
            "summary": summary,
            "wire": wire,
            "latency": latency,
        }
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    # bench/peers.py, latency.py and wire.py import this file as `run`: let them get this
    # module, not a second copy with its own BenchError that main() would not catch.
    sys.modules.setdefault("run", sys.modules[__name__])
    sys.exit(main())
