"""steptrail benchmark of a LangGraph node's cost under steptrail (ADR 0071) against the
same graph on LangGraph's own `SqliteSaver` and `PostgresSaver`, in one invocation.

    python bench/graph_nodes.py --quick              # about half a minute
    python bench/graph_nodes.py --runs 200 --json bench/results-graph-nodes.json

Needs the `langgraph` extra and, for the baselines, `langgraph-checkpoint-sqlite` and
`langgraph-checkpoint-postgres` (the `bench` extra).

What is measured: a chain graph of trivial nodes (each adds 1 to a counter), at two lengths
(`--short`, `--long` nodes). A node's cost is the slope, (time of the long graph - time of
the short one) / (long - short), per run, so what a run costs once (enqueue, claim, settle,
compile, the thread's first checkpoint) drops out and what is left is what each further node
adds. Per backend:

* **LangGraph saver**: `graph.invoke(input, {"thread_id": new}, durability="sync")` with
  `SqliteSaver` (a file, WAL) or `PostgresSaver` — every checkpoint and pending write
  committed before the next superstep, as steptrail does.
* **steptrail**: `app.graph` on the same graph; `--runs` runs of each length enqueued, then
  drained by one burst worker (one node = one journaled step, its record appended fenced).

Ratio: steptrail / saver per node (target <= 1.5).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import operator
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

from run import (
    DEFAULT_PG,
    BenchError,
    check_postgres,
    drop_database,
    quiet_logging,
    recreate_database,
)

import steptrail
from steptrail.runtime import open_runtime


class Count(TypedDict):
    count: int
    trail: Annotated[list[int], operator.add]


def chain(nodes: int) -> Any:
    from langgraph.graph import END, START, StateGraph

    def step(state: Count) -> dict[str, Any]:
        return {"count": state["count"] + 1, "trail": [state["count"]]}

    builder = StateGraph(Count)
    names = [f"n{k}" for k in range(nodes)]
    for name in names:
        builder.add_node(name, step)
    builder.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        builder.add_edge(a, b)
    builder.add_edge(names[-1], END)
    return builder


def time_saver(saver: Any, nodes: int, *, runs: int) -> float:
    graph = chain(nodes).compile(checkpointer=saver)
    started = time.perf_counter()
    for _ in range(runs):
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        out = graph.invoke({"count": 0, "trail": []}, config, durability="sync")
        if out["count"] != nodes:
            raise BenchError(f"the saver's graph counted {out['count']}, not {nodes}")
    return time.perf_counter() - started


def time_steptrail(url: str, nodes: int, *, runs: int) -> float:
    app = steptrail.App()
    app.graph("chain", chain(nodes))
    settings = steptrail.Settings(database_url=url, log_level="warning", poll_interval=0.05)
    rt = open_runtime(app, settings=settings)
    try:
        rt.enqueue_many([{"agent": "chain", "request": {"count": 0, "trail": []}}] * runs)
        started = time.perf_counter()
        report = rt.work(burst=True)
        elapsed = time.perf_counter() - started
        if report.outcomes != {"completed": runs}:
            raise BenchError(f"steptrail's graph runs ended {report.outcomes}")
        return elapsed
    finally:
        rt.close()


def per_node(timer: Any, short: int, long: int, runs: int) -> float:
    """Milliseconds one more node costs per run (the slope between the two lengths)."""
    t_short, t_long = timer(short), timer(long)
    return (t_long - t_short) / (long - short) / runs * 1000


def bench_sqlite(short: int, long: int, runs: int, rounds: int) -> dict[str, float]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    saver_ms, steptrail_ms = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            conn = sqlite3.connect(Path(tmp) / "lg.db", check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            saver = SqliteSaver(conn)
            saver.setup()
            saver_ms.append(
                per_node(functools.partial(time_saver, saver, runs=runs), short, long, runs)
            )
            conn.close()
            url = f"sqlite:///{Path(tmp) / 'st.db'}"
            steptrail_ms.append(
                per_node(functools.partial(time_steptrail, url, runs=runs), short, long, runs)
            )
    return _figures(saver_ms, steptrail_ms)


def bench_postgres(base: str, short: int, long: int, runs: int, rounds: int) -> dict[str, float]:
    from langgraph.checkpoint.postgres import PostgresSaver

    saver_ms, steptrail_ms = [], []
    for _ in range(rounds):
        lg_url = recreate_database(base, "steptrail_bench_langgraph")
        st_url = recreate_database(base, "steptrail_bench_langgraph_st")
        try:
            with PostgresSaver.from_conn_string(lg_url) as saver:
                saver.setup()
                saver_ms.append(
                    per_node(functools.partial(time_saver, saver, runs=runs), short, long, runs)
                )
            steptrail_ms.append(
                per_node(functools.partial(time_steptrail, st_url, runs=runs), short, long, runs)
            )
        finally:
            drop_database(base, "steptrail_bench_langgraph")
            drop_database(base, "steptrail_bench_langgraph_st")
    return _figures(saver_ms, steptrail_ms)


def _figures(saver_ms: list[float], steptrail_ms: list[float]) -> dict[str, float]:
    saver, ours = statistics.median(saver_ms), statistics.median(steptrail_ms)
    return {
        "saver_ms_per_node": round(saver, 3),
        "steptrail_ms_per_node": round(ours, 3),
        "ratio": round(ours / saver, 2) if saver > 0 else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL server (no database)")
    parser.add_argument("--runs", type=int, default=100, help="graph runs per length")
    parser.add_argument("--short", type=int, default=2, help="nodes of the short graph")
    parser.add_argument("--long", type=int, default=12, help="nodes of the long graph")
    parser.add_argument("--rounds", type=int, default=3, help="medians over this many rounds")
    parser.add_argument("--quick", action="store_true", help="--runs 30 --rounds 1")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds = 30, 1
    quiet_logging()
    results: dict[str, Any] = {"runs": args.runs, "short": args.short, "long": args.long}
    try:
        results["sqlite"] = bench_sqlite(args.short, args.long, args.runs, args.rounds)
        if not args.skip_postgres:
            results["postgres_version"] = check_postgres(args.pg)
            results["postgres"] = bench_postgres(
                args.pg, args.short, args.long, args.runs, args.rounds
            )
    except BenchError as error:
        print(error, file=sys.stderr)
        return 1
    for backend in ("sqlite", "postgres"):
        if backend in results:
            r = results[backend]
            print(
                f"{backend:9s} saver {r['saver_ms_per_node']:.3f} ms/node  steptrail "
                f"{r['steptrail_ms_per_node']:.3f} ms/node  ratio {r['ratio']:.2f}x"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
