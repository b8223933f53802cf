"""A user projection under load: does it keep up with the no-op drain, and how fast does it
rebuild? Both measured in one invocation, per backend.

    python bench/projections.py [--runs 2000] [--processes 2] [--concurrency 4]
                                [--rebuild-runs 2000] [--single 1000] [--json out.json]

* Keeping up: N no-op runs (`scripted`, one step: Queued, Claimed, StepRecorded, Completed)
  are enqueued, then drained by P worker processes x C (as `bench/run.py` does) while one
  more process runs the projection runner (`Runtime.projector()`) with the README's
  projection (examples/cost_per_agent_day.py). Every 0.2 s the harness samples the
  projection's lag (events of the log it has not folded). Three drains of the same N, each
  on a fresh database: no projector ("none", the main benchmark's drain), a projector
  keeping only the built-in reporting views ("views"), and one keeping the views and the
  README's projection ("both"). Reported: each drain rate, the lag at most and per quarter
  of the drain, and how long the projector needed after the drain to reach 0.
* Rebuild: the log of `--rebuild-runs` runs (6 events each, as bench/rebuild.py) is folded by
  `rebuild cost_per_agent_day` (batches of 5,000 events, one transaction each), then rewound
  and folded one event per transaction (`process_batch(1)`) for `--single` events, three
  times alternately; reported as median events/s of each and the median (and range) of the
  per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import psycopg  # noqa: E402 - after the environment is set for steptrail's settings
from rebuild import fill  # noqa: E402

from examples.cost_per_agent_day import app as cost_app  # noqa: E402
from steptrail.infrastructure.logging import configure_logging  # noqa: E402
from steptrail.runtime import Runtime, open_runtime  # noqa: E402

NAME = "cost_per_agent_day"


def runtime(url: str, *, app: Any = None) -> Runtime:
    return open_runtime(app, url=url, poll_interval=0.05, log_level="warning")


def _worker(url: str, concurrency: int) -> None:
    configure_logging("json", "warning")
    with runtime(url) as rt:
        rt.worker(concurrency=concurrency, burst=True).run()


def _projector(url: str, stop: Any, with_projection: bool) -> None:
    configure_logging("json", "warning")
    with runtime(url, app=cost_app if with_projection else None) as rt:
        projector = rt.projector()
        event = threading.Event()
        threading.Thread(target=lambda: (stop.wait(), event.set()), daemon=True).start()
        projector.run_forever(0.05, event)


def lag(rt: Runtime, name: str = NAME) -> int:
    return next((t.lag for t in rt.tracked() if t.name == name), 0)


def drain(url: str, runs: int, processes: int, concurrency: int, *, project: str) -> dict[str, Any]:
    """Enqueue `runs` no-op runs, drain them; with `project` "views", a projector process
    keeps the reporting views meanwhile, with "both" the README's projection as well, and
    the lag (of the projection, else of the views) is sampled."""
    watched = NAME if project == "both" else "reporting"
    ctx = mp.get_context("spawn")
    with runtime(url, app=cost_app) as rt:
        rt.project_all()  # creates the projection's tables, position at the head
        for _ in range(runs):
            rt.enqueue("scripted", {"steps": 1})
        stop = ctx.Event()
        projector = None
        if project != "none":
            projector = ctx.Process(target=_projector, args=(url, stop, project == "both"))
            projector.start()
            while lag(rt, watched) > 0:  # let it fold the enqueues: only the drain is measured
                time.sleep(0.05)
        workers = [ctx.Process(target=_worker, args=(url, concurrency)) for _ in range(processes)]
        started = time.perf_counter()
        for w in workers:
            w.start()
        samples: list[tuple[float, int]] = []
        while any(w.is_alive() for w in workers):
            if projector is not None:
                samples.append((time.perf_counter() - started, lag(rt, watched)))
            time.sleep(0.2)
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - started
        result: dict[str, Any] = {"drain_runs_per_s": round(runs / elapsed), "drain_s": elapsed}
        if projector is not None:
            t0 = time.perf_counter()
            while lag(rt, watched) > 0 and time.perf_counter() - t0 < 120:
                time.sleep(0.02)
            result["catch_up_after_drain_s"] = round(time.perf_counter() - t0, 2)
            stop.set()
            projector.join(10)
            quarters = [
                [n for t, n in samples if q * elapsed / 4 <= t < (q + 1) * elapsed / 4]
                for q in range(4)
            ]
            result["lag_max_events"] = max((n for _, n in samples), default=0)
            result["lag_median_per_quarter"] = [
                int(statistics.median(q)) if q else 0 for q in quarters
            ]
            result["events_in_drain"] = runs * 3
            assert rt.verify(watched) == [], "the projection drifted"
        return result


def rebuild_speed(url: str, runs: int, single: int, rounds: int = 3) -> dict[str, Any]:
    """Batched rebuild vs one transaction per event, alternated `rounds` times on one log;
    medians, and the median of the per-round ratios."""
    with runtime(url, app=cost_app) as rt:
        events = fill(rt.store, runs)
        store = rt.projection(NAME)
        batched, one_by_one = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            store.rebuild(batch=5000)
            batched.append(events / (time.perf_counter() - started))
            with rt.store.reporting_write() as tx:
                for table in store.projection.tables:
                    tx.drop(table)
                store.projection.create_tables(tx.sql())
                tx.run("rewind_tracking", {"projection": NAME})
            started = time.perf_counter()
            for _ in range(single):
                store.process_batch(1)
            one_by_one.append(single / (time.perf_counter() - started))
        ratios = [b / o for b, o in zip(batched, one_by_one, strict=True)]
        return {
            "events": events,
            "rounds": rounds,
            "batched_events_per_s": round(statistics.median(batched)),
            "per_event_tx_events_per_s": round(statistics.median(one_by_one)),
            "ratio": round(statistics.median(ratios), 1),
            "ratio_range": [round(min(ratios), 1), round(max(ratios), 1)],
        }


def pg_database(base: str, name: str) -> str:
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--processes", "-p", type=int, default=2)
    parser.add_argument("--concurrency", "-c", type=int, default=4)
    parser.add_argument("--rebuild-runs", type=int, default=2000)
    parser.add_argument("--single", type=int, default=1000)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    configure_logging("json", "warning")
    results: dict[str, Any] = {"load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        urls = {
            "sqlite": lambda tag: f"sqlite:///{tmp}/{tag}.db",
            "postgres": lambda tag: pg_database(args.pg, f"steptrail_bench_proj_{tag}"),
        }
        for backend, url_for in urls.items():
            figures = {
                f"drain_{mode}": drain(
                    url_for(mode), args.runs, args.processes, args.concurrency, project=mode
                )
                for mode in ("none", "views", "both")
            }
            figures.update(
                {
                    "rebuild": rebuild_speed(url_for("rebuild"), args.rebuild_runs, args.single),
                }
            )
            rate = {m: figures[f"drain_{m}"]["drain_runs_per_s"] for m in ("none", "views", "both")}
            figures["drain_ratio_views_over_none"] = round(rate["views"] / rate["none"], 2)
            figures["drain_ratio_both_over_views"] = round(rate["both"] / rate["views"], 2)
            results[backend] = figures
            print(backend, json.dumps(figures, indent=2), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
