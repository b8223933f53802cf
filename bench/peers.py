"""The durable-workflow peer of bench/run.py: the same drain on steptrail and on DBOS Transact
3.4.0, each in a process of its own, on PostgreSQL and on SQLite.

    python bench/run.py --quick                  # the peers are part of every round
    python bench/run.py --no-peers               # without them

A drain has a `Shape`: N runs (workflows) of S steps each, drained by one worker process of
C slots. S = 1 is the "no-op" shape (one recorded step, then complete) and S = 5 the
"five-step" one.

* steptrail: N runs of the built-in `scripted` agent with `{"steps": S}` are enqueued
  (untimed), then one spawned process builds `Runtime.worker(concurrency=C, burst=True)`
  (untimed, as DBOS is launched before its clock; ADR 0091) and runs it until nothing is
  left: the clock runs from the start signal to the worker's return.
* DBOS: one spawned process configures DBOS on the same kind of database, declares a no-op
  `@DBOS.step()` and a `@DBOS.workflow()` calling it S times, launches, registers the queue
  `bench` with `worker_concurrency=C` and `polling_interval_sec=poll`, and enqueues N
  workflows, each under `SetEnqueueOptions(delay_seconds=...)` so that all of them become
  runnable at one instant T after the enqueueing finished (then `ANALYZE` and `CHECKPOINT`,
  as for steptrail). At T the clock starts and the
  process moves the delayed workflows to ENQUEUED itself (the statement DBOS's own
  background job runs once a second; see ADR 0079), then waits until the last workflow
  function returned and `DBOS.list_workflows(status="SUCCESS", queue_name="bench")` counts
  N: the clock stops there.

Figures per drain: runs/s, the worker process's CPU per run (getrusage over the timed part)
and on PostgreSQL the server backends' CPU per run (read from /proc, as bench/run.py does).
Every drain starts from a fresh database.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import resource
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from run import (
    AGENT,
    STARTUP_TIMEOUT_S,
    BenchError,
    Config,
    SteptrailDrain,
    _check_done,
    backend_cpu_s,
    quiet_logging,
    recreate_database,
    run_in_processes,
    settle,
    steptrail_settings,
)

from steptrail.runtime import open_runtime

DB_STEPTRAIL_PEER = "steptrail_bench_peer"
DB_DBOS = "dbos_bench"
SHAPES = {"noop": 1, "five_step": 5}
DBOS_QUEUE = "bench"
# T lies this far after the first enqueue: the enqueueing must be over by then (checked).
DBOS_START_MARGIN_S = 0.5
# Per workflow: 2-15 ms each on this busy machine (SQLite the slower); T must not come
# before the enqueueing and the settle (ANALYZE, CHECKPOINT) are done.
DBOS_ENQUEUE_BUDGET_S = 0.04
DBOS_SUCCESS_POLL_S = 0.002


@dataclass(frozen=True)
class Shape:
    runs: int  # N
    steps: int  # S
    concurrency: int  # C
    poll: float  # DBOS's queue polling interval, seconds


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def figures(n: int, elapsed_s: float, worker_cpu_s: float, server_cpu_s: float | None) -> dict:
    out = {"drain": n / elapsed_s, "worker_cpu_ms": worker_cpu_s / n * 1000}
    if server_cpu_s is not None:
        out["server_cpu_ms"] = server_cpu_s / n * 1000
        out["cpu_ms"] = out["worker_cpu_ms"] + out["server_cpu_ms"]
    return out


# -- steptrail -----------------------------------------------------------------------------------


def steptrail_drain(url: str, shape: Shape, cfg: Config) -> dict[str, float]:
    """Enqueue N runs of S steps, then drain them in one spawned worker process."""
    with open_runtime(settings=steptrail_settings(url)) as runtime:
        for _ in range(shape.runs):
            runtime.enqueue(AGENT, {"steps": shape.steps})
    settle(url, cfg)
    database = None if url.startswith("sqlite:") else DB_STEPTRAIL_PEER
    one = replace(cfg, processes=1, runs=shape.runs, concurrency=shape.concurrency)
    drain = run_in_processes(SteptrailDrain, (url, shape.concurrency), one, database=database)
    _check_done(f"steptrail peer {url.split(':', 1)[0]}", drain.reports, shape.runs)
    return figures(shape.runs, drain.elapsed_s, drain.worker_cpu_s, drain.server_cpu_s)


# -- DBOS ----------------------------------------------------------------------------------------


def _dbos_child(url: str, shape: Shape, database: str | None, cfg: Config, results: Any) -> None:
    """One DBOS drain, all in this process (DBOS is one instance per process)."""
    quiet_logging()
    try:
        results.put(_dbos_drain_here(url, shape, database, cfg))
    except BaseException as error:
        results.put({"error": f"{type(error).__name__}: {error}"})


def _dbos_drain_here(url: str, shape: Shape, database: str | None, cfg: Config) -> dict[str, Any]:
    from dbos import DBOS, SetEnqueueOptions
    from dbos._dbos import _get_dbos_instance

    n = shape.runs
    finished = threading.Event()
    lock = threading.Lock()
    count = [0]

    DBOS(config={"name": "bench", "system_database_url": url, "log_level": "ERROR"})

    @DBOS.step()
    def noop_step() -> None:
        return None

    @DBOS.workflow()
    def bench_workflow(steps: int) -> int:
        for _ in range(steps):
            noop_step()
        with lock:
            count[0] += 1
            if count[0] == n:
                finished.set()
        return steps

    try:
        DBOS.launch()
        # Declared after launch: 3.4.0 persists a queue's configuration in the database.
        bench_queue = DBOS.register_queue(
            DBOS_QUEUE, worker_concurrency=shape.concurrency, polling_interval_sec=shape.poll
        )
        start_at = time.time() + DBOS_START_MARGIN_S + n * DBOS_ENQUEUE_BUDGET_S
        enqueue_started = time.perf_counter()
        for _ in range(n):
            with SetEnqueueOptions(delay_seconds=start_at - time.time()):
                bench_queue.enqueue(bench_workflow, shape.steps)
        enqueue_rate = n / (time.perf_counter() - enqueue_started)
        # As for steptrail before its drain: planner statistics and a checkpoint (run.py).
        settle(url, cfg)
        if time.time() > start_at - 0.05:
            raise BenchError("DBOS: the enqueueing and settle overran the start instant T")
        time.sleep(max(0.0, start_at - 0.05 - time.time()))
        server_before = backend_cpu_s(database)
        cpu_before = _own_cpu_s()
        while time.time() < start_at:
            time.sleep(0.0005)
        started = time.monotonic()
        # What DBOS's background job does once a second: DELAYED -> ENQUEUED for every
        # workflow whose delay is over; done here at T so no drain waits for that job.
        _get_dbos_instance()._sys_db.transition_delayed_workflows()
        timeout = max(120.0, n / 5)
        if not finished.wait(timeout):
            raise BenchError(f"DBOS: {count[0]} of {n} workflows ran within {timeout:.0f}s")
        succeeded = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            succeeded = len(
                DBOS.list_workflows(
                    status="SUCCESS",
                    queue_name=DBOS_QUEUE,
                    load_input=False,
                    load_output=False,
                )
            )
            if succeeded >= n:
                break
            time.sleep(DBOS_SUCCESS_POLL_S)
        elapsed = time.monotonic() - started
        cpu = _own_cpu_s() - cpu_before
        server_after = backend_cpu_s(database)
        if succeeded != n:
            raise BenchError(f"DBOS: {succeeded} of {n} workflows reached SUCCESS")
    finally:
        DBOS.destroy()
    server = None
    if server_before is not None and server_after is not None:
        server = server_after - server_before
    return {"elapsed_s": elapsed, "cpu_s": cpu, "server_cpu_s": server, "enqueue": enqueue_rate}


def dbos_drain(url: str, shape: Shape, cfg: Config) -> dict[str, float]:
    """One DBOS drain in a spawned process; its figures."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    database = None if url.startswith("sqlite:") else DB_DBOS
    proc = ctx.Process(target=_dbos_child, args=(url, shape, database, cfg, results), daemon=True)
    proc.start()
    try:
        report = results.get(timeout=STARTUP_TIMEOUT_S + max(120.0, shape.runs / 5))
    except queue.Empty:
        raise BenchError("DBOS: the drain process did not report") from None
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
    if "error" in report:
        raise BenchError(f"DBOS drain failed: {report['error']}")
    out = figures(shape.runs, report["elapsed_s"], report["cpu_s"], report["server_cpu_s"])
    out["enqueue"] = report["enqueue"]
    return out


# -- one round's peer figures --------------------------------------------------------------------


def peer_figures(cfg: Config, folder: Path, index: int, backend: str) -> dict[str, float]:
    """steptrail and DBOS, no-op and five-step, on one backend ("pg" or "sqlite"), from fresh
    databases; which system goes first alternates from round to round."""
    out: dict[str, float] = {}
    for name, steps in SHAPES.items():
        shape = Shape(cfg.peer_runs, steps, cfg.concurrency, cfg.dbos_poll)

        def steptrail(shape: Shape = shape, name: str = name) -> dict[str, float]:
            if backend == "pg":
                url = recreate_database(cfg.pg, DB_STEPTRAIL_PEER)
            else:
                url = f"sqlite:///{folder / f'peer-steptrail-{index}-{name}.db'}"
            return steptrail_drain(url, shape, cfg)

        def dbos(shape: Shape = shape, name: str = name) -> dict[str, float]:
            if backend == "pg":
                url = recreate_database(cfg.pg, DB_DBOS)
            else:
                path = folder / f"peer-dbos-{index}-{name}.sqlite"
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                url = f"sqlite:///{path}"
            return dbos_drain(url, shape, cfg)

        systems = [("steptrail", steptrail), ("dbos", dbos)]
        if index % 2:
            systems.reverse()
        for system, measure in systems:
            for key, value in measure().items():
                out[f"peer_{backend}_{system}_{name}_{key}"] = value
    return out
