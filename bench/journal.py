"""steptrail benchmark of the step journal (ADR 0013), on SQLite and PostgreSQL, measured in
one invocation so that the ratios compare like with like.

    python bench/journal.py --quick              # about half a minute
    python bench/journal.py                      # 5 rounds
    python bench/journal.py --json out.json

What is measured, per backend and per round (see bench/README.md):

* **append without / with the journal**: two claimed runs, then K x (`Run.record_step`
  with the payload the scripted agent records + `store.append`) on each: one run's steps
  without a journal entry (the append as before the journal), the other's with one (the
  step's verbatim outcome, a short string like the scripted agent's). The two alternate in
  batches of 25 appends, so load on the machine hits both alike. Ratio: with / without
  (target >= 0.85).
* **replay of a 300-step run**: a run's 300 steps are executed through the real
  `RunContext` (each step appended at the next boundary, with its journal entry): the
  original step-append time. The run is requeued and claimed again, and a new segment
  reads the journal (one query) and replays the 300 step calls through a new
  `RunContext`: the replay time. Ratio: replay / original (target <= 0.10).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog
from run import (
    AGENT,
    DEFAULT_PG,
    BenchError,
    check_postgres,
    drop_database,
    quiet_logging,
    recreate_database,
    step_payload,
    steptrail_settings,
)

from steptrail.domain.enums import FailureClass, PrivacyLevel
from steptrail.domain.journal import JournalCursor, JournalEntry, StepCall, fingerprint
from steptrail.domain.run import Run
from steptrail.runtime import Runtime, open_runtime
from steptrail.workers.context import Recorded, RunContext
from steptrail.workers.holders import holder_name
from steptrail.workers.segment import Segment

DB_JOURNAL = "steptrail_bench_journal"
REPLAY_STEPS = 300


def claim(runtime: Runtime) -> Run:
    runtime.enqueue(AGENT, {"steps": 1})
    claimed = runtime.store.claim(
        holder=holder_name("bench"), lease_ms=runtime.settings.lease_ms, agents=[AGENT]
    )
    if claimed is None:
        raise BenchError("the run just enqueued could not be claimed")
    return claimed.run


BATCH = 25


def append_rates(runtime: Runtime, k: int) -> tuple[float, float, float, float]:
    """(appends/s without, with the journal; CPU µs per append without, with): K x
    (record_step + store.append) on each of two claimed runs, alternating in batches of 25
    so that the machine's load hits both alike. CPU is this thread's (user + system), which
    on SQLite is the whole append and does not count time spent waiting for a core."""
    plain, journaled = claim(runtime), claim(runtime)
    payloads = [step_payload(i) for i in range(1, k + 1)]
    calls = [StepCall("llm", f"think-{i}", fingerprint(p)) for i, p in enumerate(payloads, 1)]
    spent = {False: 0.0, True: 0.0}
    cpu = {False: 0.0, True: 0.0}
    for first in range(0, k, BATCH):
        order = (False, True) if (first // BATCH) % 2 == 0 else (True, False)
        for with_journal in order:
            run = journaled if with_journal else plain
            started, cpu_started = time.perf_counter(), time.thread_time()
            for i in range(first, min(first + BATCH, k)):
                run.record_step(
                    kind="llm",
                    name=f"think-{i + 1}",
                    duration_ms=0,
                    payload=payloads[i],
                    tokens=10,
                    cost=0.0001,
                    # Encoding the outcome is part of what the journal adds to a step.
                    journal=JournalEntry.of_value(i + 1, calls[i], f"thought {i + 1}")
                    if with_journal
                    else None,
                )
                runtime.store.append(run)
            spent[with_journal] += time.perf_counter() - started
            cpu[with_journal] += time.thread_time() - cpu_started
    for run in (plain, journaled):
        run.complete(result={"steps": k}, privacy=PrivacyLevel.METADATA)
        runtime.store.append(run)
    return k / spent[False], k / spent[True], cpu[False] / k * 1e6, cpu[True] / k * 1e6


def context(runtime: Runtime, run: Run, journal: JournalCursor) -> tuple[Segment, RunContext]:
    segment = Segment(runtime.store, run, lease_s=600, log=structlog.get_logger())
    ctx = RunContext(
        segment,
        request={},
        privacy=PrivacyLevel.METADATA,
        effect_of=runtime.app.effect_of,
        journal=journal,
    )
    return segment, ctx


def steps(ctx: RunContext, n: int) -> None:
    """The scripted agent's model-call steps, through the real context."""
    for k in range(1, n + 1):
        ctx.llm(
            f"think-{k}",
            lambda k=k: Recorded(f"thought {k}", tokens=10, cost=0.0001),  # type: ignore[misc]
            payload={"messages": [{"role": "user", "content": f"step {k}"}], "round": k},
        )


def replay_times(runtime: Runtime, n: int) -> tuple[float, float]:
    """(original step-append time, replay time) of an n-step run, in seconds."""
    run = claim(runtime)
    segment, ctx = context(runtime, run, JournalCursor())
    started = time.perf_counter()
    steps(ctx, n)
    segment.boundary()  # the last step's record (it would ride with the settle)
    original = time.perf_counter() - started
    segment.commit(
        lambda r: r.requeue(delay_ms=0, failure_class=FailureClass.SERVER_ERROR, error_type="X")
    )
    again = runtime.store.claim(
        holder=holder_name("bench"), lease_ms=runtime.settings.lease_ms, agents=[AGENT]
    )
    if again is None or again.run.id != run.id:
        raise BenchError("the requeued run could not be claimed again")
    started = time.perf_counter()
    journal = JournalCursor(runtime.store.journal(run.id))
    segment, ctx = context(runtime, again.run, journal)
    steps(ctx, n)
    replay = time.perf_counter() - started
    if ctx.replayed != n or segment.run.pending_events:
        raise BenchError(f"expected {n} replayed steps and nothing to append")
    return original, replay


def bench_backend(url: str, k: int) -> dict[str, float]:
    with open_runtime(settings=steptrail_settings(url)) as runtime:
        without, with_journal, cpu_without, cpu_with = append_rates(runtime, k)
        original, replay = replay_times(runtime, REPLAY_STEPS)
    return {
        "append_without": without,
        "append_with": with_journal,
        "ratio_append": with_journal / without,
        "cpu_us_without": cpu_without,
        "cpu_us_with": cpu_with,
        "ratio_append_cpu": cpu_without / cpu_with,
        "original_s": original,
        "replay_s": replay,
        "ratio_replay": replay / original,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="K=300, 2 rounds")
    parser.add_argument("--appends", type=int, help="K appends per loop (default 1000)")
    parser.add_argument("--rounds", type=int, help="rounds (default 5)")
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL server URL, no database")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    args = parser.parse_args()
    k = args.appends or (300 if args.quick else 1000)
    rounds = args.rounds or (2 if args.quick else 5)
    quiet_logging()
    try:
        check_postgres(args.pg)
    except BenchError as error:
        print(error, file=sys.stderr)
        return 2
    results: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgres": []}
    try:
        with tempfile.TemporaryDirectory() as folder:
            for index in range(rounds):
                lite = f"sqlite:///{Path(folder) / f'journal-{index}.db'}"
                results["sqlite"].append(bench_backend(lite, k))
                pg = recreate_database(args.pg, DB_JOURNAL)
                results["postgres"].append(bench_backend(pg, k))
    finally:
        drop_database(args.pg, DB_JOURNAL)
    print(f"steptrail journal benchmark: K = {k} appends per loop, {rounds} round(s), ")
    print(f"replay of a {REPLAY_STEPS}-step run; medians over rounds (min-max of ratios)\n")
    summary: dict[str, Any] = {"appends": k, "rounds": rounds, "replay_steps": REPLAY_STEPS}
    for backend, figures in results.items():
        med = {key: statistics.median(f[key] for f in figures) for key in figures[0]}
        spread = {
            key: (min(f[key] for f in figures), max(f[key] for f in figures))
            for key in ("ratio_append", "ratio_append_cpu", "ratio_replay")
        }
        summary[backend] = {"median": med, "rounds": figures}
        print(
            f"{backend:8s} append without journal {med['append_without']:8.0f}/s, "
            f"with {med['append_with']:8.0f}/s: ratio {med['ratio_append']:.2f} "
            f"({spread['ratio_append'][0]:.2f}-{spread['ratio_append'][1]:.2f}; target >= 0.85)"
        )
        print(
            f"{'':8s} CPU per append without {med['cpu_us_without']:6.0f} us, "
            f"with {med['cpu_us_with']:6.0f} us: ratio {med['ratio_append_cpu']:.2f} "
            f"({spread['ratio_append_cpu'][0]:.2f}-{spread['ratio_append_cpu'][1]:.2f})"
        )
        print(
            f"{'':8s} {REPLAY_STEPS}-step run: appends {med['original_s'] * 1000:8.1f} ms, "
            f"replay {med['replay_s'] * 1000:6.1f} ms: ratio {med['ratio_replay']:.3f} "
            f"({spread['ratio_replay'][0]:.3f}-{spread['ratio_replay'][1]:.3f}; target <= 0.10)"
        )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
