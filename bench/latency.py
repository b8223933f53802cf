"""Latency figures of bench/run.py: how long one run waits for an idle worker, one step's
record, and a resume after an approval; p50/p99 on SQLite and PostgreSQL.

    python bench/run.py --quick                  # latency once at the end (50 samples)
    python bench/run.py --latency-samples 500    # more samples; --no-latency skips them

One process holds the runtime and an idle worker of 4 slots running in a thread, with the
default poll interval (an idle worker is woken by the store: in-process on SQLite, by
LISTEN/NOTIFY on PostgreSQL, else it looks again after `poll_interval`). One sample at a
time, each after the previous run has settled, so the worker is idle when it starts:

* enqueue -> start: the clock starts before `rt.enqueue(...)` and stops when the agent's first
  step calls its function (`time.perf_counter()` inside the step).
* step record: an agent calls `ctx.llm(name, fn)` with a no-op `fn` over and over; each
  call's duration is one step's record (the step boundary appends the previous step's
  event and journal entry, fenced, then `fn` runs).
* approve -> resume: a run asks for approval and suspends; the clock starts before
  `rt.approve(run_id, by=..., resume="queue")` and stops when the resumed segment's code
  after `ctx.request_approval(...)` runs (nothing precedes the approval, so nothing replays).

A few warm-up samples of each are dropped first (connections, prepared statements).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

from run import BenchError, Config, recreate_database

from steptrail.domain.enums import RunStatus
from steptrail.infrastructure.settings import Settings
from steptrail.runtime import Runtime, open_runtime
from steptrail.workers.context import RunContext
from steptrail.workers.registry import App

DB_LATENCY = "steptrail_bench_latency"
WARM_UP = 5
SLOTS = 4
WAIT_S = 30.0

app = App()
app.tool("bench_call", effect="read_only")
_marks: dict[int, float] = {}
_marked = threading.Condition()
_step_times: list[float] = []


def _mark(i: int) -> None:
    with _marked:
        _marks[i] = time.perf_counter()
        _marked.notify_all()


@app.agent("bench_latency_start")
def latency_start(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    ctx.step("mark", "started", lambda: _mark(request["i"]))
    return {}


@app.agent("bench_latency_steps")
def latency_steps(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    for k in range(request["n"] + 1):
        started = time.perf_counter()
        ctx.llm(f"think-{k}", lambda k=k: f"thought {k}")
        if k:  # the first call has no previous step to record
            _step_times.append(time.perf_counter() - started)
    return {}


@app.agent("bench_latency_approve")
def latency_approve(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    ctx.request_approval([{"name": "bench_call", "arguments": {"i": request["i"]}}])
    _mark(request["i"])  # the resumed segment: the decision came back
    return {}


def _wait_mark(i: int) -> float:
    with _marked:
        if not _marked.wait_for(lambda: i in _marks, WAIT_S):
            raise BenchError(f"latency: sample {i} never started")
        return _marks.pop(i)


def _wait_status(rt: Runtime, run_id: UUID, done: Callable[[RunStatus], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done(rt.get(run_id).status):
        if time.monotonic() > deadline:
            raise BenchError(f"latency: run {run_id} stuck in {rt.get(run_id).status}")
        time.sleep(0.001)


def _settled(status: RunStatus) -> bool:
    if status in (RunStatus.FAILED, RunStatus.CANCELLED):
        raise BenchError(f"latency: a run ended {status}")
    return status is RunStatus.COMPLETED


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(samples_ms, n=100, method="inclusive")
    return {
        "p50": statistics.median(samples_ms),
        "p99": cuts[98],
        "mean": statistics.fmean(samples_ms),
        "max": max(samples_ms),
        "n": len(samples_ms),
    }


def enqueue_to_start(rt: Runtime, samples: int) -> list[float]:
    out: list[float] = []
    for i in range(WARM_UP + samples):
        started = time.perf_counter()
        run_id = rt.enqueue("bench_latency_start", {"i": i})
        out.append((_wait_mark(i) - started) * 1000)
        _wait_status(rt, run_id, _settled)
    return out[WARM_UP:]


def step_record(rt: Runtime, samples: int) -> list[float]:
    _step_times.clear()
    run_id = rt.enqueue("bench_latency_steps", {"n": WARM_UP + samples})
    _wait_status(rt, run_id, _settled)
    return [t * 1000 for t in _step_times[WARM_UP:]]


def approve_to_resume(rt: Runtime, samples: int) -> list[float]:
    out: list[float] = []
    for i in range(WARM_UP + samples):
        run_id = rt.enqueue("bench_latency_approve", {"i": i})
        _wait_status(rt, run_id, lambda s: s is RunStatus.WAITING_FOR_APPROVAL)
        time.sleep(0.002)  # let the worker settle the suspension and go idle
        started = time.perf_counter()
        rt.approve(run_id, by="bench", resume="queue")
        out.append((_wait_mark(i) - started) * 1000)
        _wait_status(rt, run_id, _settled)
    return out[WARM_UP:]


def measure_one(url: str, samples: int) -> dict[str, Any]:
    """The three figures on the database at `url`, with the default poll interval."""
    settings = Settings(database_url=url, log_level="warning")
    with open_runtime(app, settings=settings) as rt:
        worker = rt.worker(concurrency=SLOTS)
        thread = threading.Thread(target=worker.run, name="bench-latency-worker", daemon=True)
        thread.start()
        try:
            time.sleep(0.2)  # the worker is up and idle (LISTENing on PostgreSQL)
            figures = {
                "enqueue_to_start_ms": percentiles(enqueue_to_start(rt, samples)),
                "step_record_ms": percentiles(step_record(rt, samples)),
                "approve_to_resume_ms": percentiles(approve_to_resume(rt, samples)),
            }
        finally:
            worker.stop()
            thread.join(timeout=WAIT_S)
    figures["poll_interval_s"] = settings.poll_interval
    return figures


def measure(cfg: Config, folder: Path) -> dict[str, Any]:
    """SQLite (a file in `folder`) and PostgreSQL (a fresh database), `cfg.latency_samples`
    samples of each figure."""
    sqlite_url = f"sqlite:///{folder / 'latency.db'}"
    return {
        "sqlite": measure_one(sqlite_url, cfg.latency_samples),
        "pg": measure_one(recreate_database(cfg.pg, DB_LATENCY), cfg.latency_samples),
        "samples": cfg.latency_samples,
        "worker_slots": SLOTS,
    }
