"""Scale benchmark: the same measurements on databases of different sizes, side by side.

For each backend (SQLite, PostgreSQL) and each history size H (default 10,000 and 1,000,000
runs), in one invocation:

1. **Build** a database holding H settled runs (Queued → Claimed → StepRecorded → settled:
   96 % completed, 2 % dead-lettered, 2 % cancelled; the oldest `--purge` runs 400 days old,
   the rest spread over the last 30 days), through the stores' `bulk_load_settled` (the runs
   are made by the domain's own methods; the index rows are what `rebuild` folds), then bring
   the reporting views up to date with the projector and check it all with `verify`.
2. **Hot path**: `enqueue_many` a backlog of `--runs` no-op runs, then one in-process worker
   (`--concurrency`) drains it: claim + step + complete rate.
3. **Reaper**: `--stale` runs claimed under a 1 ms lease; the time `reap` takes to reclaim
   them all.
4. **Reads**: `stats`, `runs`, `runs --status failed` and `show` of a settled run, each run
   in-process through the CLI (median of `--repeat`), and the time to open a runtime (the
   floor every command pays).
5. **Maintenance**: `verify`, `rebuild run-index` and `rebuild reporting` as subprocesses
   (`python -m steptrail …`): wall time and peak RSS (`wait4`'s ru_maxrss).
6. **Purge** of the `--purge` old runs: time per run; and the database's size per run.

With `--rounds R` (R > 1) steps 2-4 and 6 run R times per size, each time on a fresh copy
of the built database (PostgreSQL `CREATE DATABASE … TEMPLATE`, SQLite's online backup), and
their medians are reported: on a shared machine one slow moment otherwise decides a ratio
(`bench/scale_phases.py` does the same on kept templates, sizes alternating). The
maintenance commands run once, on the built database.

Then a table per backend: each figure at each size and the ratio largest / smallest size.
Everything runs in one process per backend and size, one after the other; nothing else of
this script runs meanwhile. Database names are unique to this process
(`steptrail_scale_<pid>_<size>`), SQLite files live in a temporary folder, and both are
removed at the end unless `--keep`.

    python bench/scale.py --sizes 10000,100000            # both backends, a few minutes
    python bench/scale.py                                  # 10k and 1M: long (see README)
    python bench/scale.py --backends sqlite --sizes 10000,1000000 --json out.json
    python bench/scale.py --backends postgres --rounds 3      # short phases: medians of 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")

import psycopg
from psycopg import sql
from typer.testing import CliRunner

from steptrail.cli import cli
from steptrail.domain.digest import canonical_json, digest
from steptrail.domain.enums import FailureClass, TerminationReason
from steptrail.domain.ids import ENTROPY_BYTES, time_ordered_id
from steptrail.domain.run import Run
from steptrail.infrastructure.settings import Settings
from steptrail.runtime import Runtime, open_runtime

REPO = Path(__file__).resolve().parents[1]
AGENT = "scripted"
REQUEST = {"steps": 1}
BODY = canonical_json(REQUEST)
HOLDER = "worker:scale-load"
LOAD_BATCH = 5000
OLD_DAYS = 400  # the runs `purge --days PURGE_DAYS` removes
PURGE_DAYS = 365
SPREAD = timedelta(days=30)


# -- building a database ---------------------------------------------------------------------


def settled_runs(
    count: int, first: int, now: datetime, size: int, old: int, *, ids: str = "ordered"
) -> Iterator[Any]:
    """(run, instant of its first event, kept request) for runs `first … first+count-1` of
    a history of `size`: made by the domain's own methods, settled in one segment. Run ids
    are made as the runtime makes them (`ordered`: version 7, from the run's creation
    instant, ADR 0052) or, to measure a database from before that, `random` (version 4)."""
    step = SPREAD / max(1, size)
    for i in range(first, first + count):
        at = now - timedelta(days=OLD_DAYS) + i * timedelta(seconds=1) if i < old else (
            now - SPREAD + i * step
        )  # fmt: skip
        run_id = (
            time_ordered_id(int(at.timestamp() * 1000), os.urandom(ENTROPY_BYTES))
            if ids == "ordered"
            else uuid4()
        )
        run = Run.enqueue(
            run_id=run_id,
            agent=AGENT,
            request_digest=digest(REQUEST),
            actor="scale-load",
        )
        run.claim(holder=HOLDER, lease_ms=60_000)
        run.record_step(kind="llm", name="step-1", duration_ms=5, payload={"i": i}, tokens=10)
        kept = None
        if i % 50 == 7:
            run.dead_letter(
                actor=HOLDER,
                reason=TerminationReason.NOT_RETRYABLE,
                cause="scale-load",
                failure_class=FailureClass.CLIENT_ERROR,
                error_type="ValueError",
            )
            kept = BODY  # a failed run keeps its request (ADR 0025)
        elif i % 50 == 13:
            run.cancel(actor="scale-load")
        else:
            run.complete(result={"ok": True})
        yield run, at, kept


def build(
    rt: Runtime, size: int, old: int, say: Callable[[str], None], ids: str = "ordered"
) -> dict[str, float]:
    now = datetime.now(UTC) - timedelta(minutes=5)
    started = time.perf_counter()
    events = 0
    for first in range(0, size, LOAD_BATCH):
        count = min(LOAD_BATCH, size - first)
        runs = list(settled_runs(count, first, now, size, old, ids=ids))
        events += sum(len(run.pending_events) for run, _, _ in runs)
        rt.store.bulk_load_settled(runs)
        if (first // LOAD_BATCH) % 20 == 19:
            say(f"  loaded {first + count:,} runs ({time.perf_counter() - started:.0f} s)")
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    folded = 0
    # On PostgreSQL the views read only transactions older than the oldest one running in
    # the cluster (ADR 0012): another database's long transaction holds them back, so fold
    # until every loaded event is in.
    while folded < events:
        done = rt.project(batch=5000)
        folded += done
        if done == 0:
            if time.perf_counter() - started > 1800:
                raise RuntimeError(f"the views folded {folded:,} of {events:,} events")
            time.sleep(0.2)
    projected = time.perf_counter() - started
    return {"load_s": loaded, "project_s": projected, "events": float(events)}


# -- measuring -------------------------------------------------------------------------------


def timed_subprocess(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run `python -m steptrail ARGS`; wall time, peak RSS (MB) and exit code."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "steptrail", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = started + timeout
    output = b""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        chunk = proc.stdout.read() or b""
        output += chunk[-4000:]
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            return {"s": float("nan"), "rss_mb": usage.ru_maxrss / 1024, "code": "timeout"}
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "s": time.perf_counter() - started,
        "rss_mb": usage.ru_maxrss / 1024,  # kilobytes on Linux
        "code": proc.returncode,
        "tail": output.decode("utf-8", "replace")[-400:],
    }


def hot_path(rt: Runtime, runs: int, concurrency: int) -> dict[str, float]:
    items = [{"agent": AGENT, "request": REQUEST}] * runs
    started = time.perf_counter()
    rt.enqueue_many(items)
    enqueued = time.perf_counter() - started
    started = time.perf_counter()
    report = rt.work(concurrency=concurrency, burst=True)
    drained = time.perf_counter() - started
    if report.outcomes.get("completed") != runs:
        raise RuntimeError(f"hot path: expected {runs} completed, got {dict(report.outcomes)}")
    return {"enqueue_many_per_s": runs / enqueued, "drain_per_s": runs / drained}


def reaper(rt: Runtime, stale: int) -> dict[str, float]:
    rt.enqueue_many([{"agent": AGENT, "request": REQUEST}] * stale)
    claimed = 0
    while claimed < stale:
        got = rt.store.claim_batch(
            holder="worker:scale-dead", lease_ms=1, agents=[AGENT], limit=stale - claimed
        )
        if not got:
            raise RuntimeError("reaper: the stale runs could not all be claimed")
        claimed += len(got)
    time.sleep(0.2)  # every lease has expired
    started = time.perf_counter()
    reaped = 0
    while reaped < stale:
        done = rt.reap(limit=stale).reaped
        if done == 0:
            raise RuntimeError(f"reaper: found only {reaped} of {stale} stale runs")
        reaped += done
    seconds = time.perf_counter() - started
    rt.work(concurrency=4, burst=True)  # leave no backlog behind for the reads
    return {"reap_s": seconds, "reap_ms_per_run": 1000 * seconds / stale}


def cli_latency(args: list[str], env: dict[str, str], repeat: int) -> float:
    """Median seconds of `steptrail ARGS` run in-process (output captured and dropped)."""
    runner = CliRunner()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = runner.invoke(cli, args, env=env, catch_exceptions=False)
        times.append(time.perf_counter() - started)
        if result.exit_code != 0:
            raise RuntimeError(f"steptrail {' '.join(args)} exited {result.exit_code}")
    return statistics.median(times)


def open_latency(url: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        open_runtime(url=url).close()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def reads(rt: Runtime, env: dict[str, str], repeat: int) -> dict[str, float]:
    shown = rt.runs(status="completed", limit=1)[0].run_id
    return {
        "open_s": open_latency(env["STEPTRAIL_DATABASE_URL"], repeat),
        "stats_s": cli_latency(["stats"], env, repeat),
        "runs_s": cli_latency(["runs"], env, repeat),
        "runs_failed_s": cli_latency(["runs", "--status", "failed"], env, repeat),
        "show_s": cli_latency(["show", str(shown)], env, repeat),
    }


def database_bytes(rt: Runtime, url: str) -> int:
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        with rt.store.datastore.get_connection(commit=True) as conn, conn.cursor() as cur:
            cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        assert row is not None
        return int(row[0])


def command_env(url: str) -> dict[str, str]:
    """The environment of a `steptrail` command on `url`: ours, without other STEPTRAIL_
    settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env.update(STEPTRAIL_DATABASE_URL=url, STEPTRAIL_LOG_LEVEL="warning")
    return env


def measure(url: str, size: int, cfg: argparse.Namespace, say: Callable[[str], None]) -> dict:
    env = command_env(url)
    figures: dict[str, Any] = {"size": size}
    settings = Settings(database_url=url, log_level="warning")
    with open_runtime(settings=settings) as rt:
        empty = database_bytes(rt, url)
        say(f"{rt.backend} {size:,}: building")
        figures.update(build(rt, size, min(cfg.purge, size // 2), say))
        figures["bytes_per_run"] = (database_bytes(rt, url) - empty) / size
        if url.startswith("postgres"):
            # What autovacuum does to a table as it grows (an insert-driven VACUUM since
            # PostgreSQL 13: hint bits, the visibility map; then statistics). A history
            # that grew over weeks has had it; one loaded in minutes has not, and without
            # it the first phases after the load pay for it: the 1M run of 15:10 UTC
            # measured the hot path at 0.40x and the purge's VACUUM at 3.6 s on a database
            # only ANALYZEd, against flat figures on a VACUUMed copy (bench/README.md).
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
        say(f"{rt.backend} {size:,}: built in {figures['load_s'] + figures['project_s']:.0f} s;"
            " verify")  # fmt: skip
        checked = timed_subprocess(["verify"], env, cfg.timeout)
        figures["verify_s"], figures["verify_rss_mb"] = checked["s"], checked["rss_mb"]
        figures["verify_clean"] = checked["code"] == 0
        if checked["code"] != 0:
            say(f"  verify: exit {checked['code']}: {checked.get('tail', '')}")
        backend = rt.backend
    # The short phases change the database (runs added, reaped, purged), so repeated rounds
    # each run on a fresh copy of the built one; a single round runs on the database itself.
    if cfg.rounds == 1:
        say(f"{backend} {size:,}: hot path, reaper, reads, purge")
        figures.update(short_phases(url, cfg))
    else:
        rounds = []
        for index in range(cfg.rounds):
            with copied(url, cfg) as copy:
                rounds.append(short_phases(copy, cfg))
            say(f"{backend} {size:,}: round {index + 1}/{cfg.rounds}: "
                f"{json.dumps({k: round(v, 4) for k, v in rounds[-1].items()})}")  # fmt: skip
        figures["rounds"] = rounds
        figures.update({key: statistics.median(r[key] for r in rounds) for key in rounds[0]})
    say(f"{backend} {size:,}: rebuild")
    for view in ("run-index", "reporting"):
        done = timed_subprocess(["rebuild", view], env, cfg.timeout)
        key = view.replace("-", "_")
        figures[f"rebuild_{key}_s"], figures[f"rebuild_{key}_rss_mb"] = done["s"], done["rss_mb"]
        if done["code"] != 0:
            say(f"  rebuild {view}: exit {done['code']}: {done.get('tail', '')}")
    # Per run, net of a subprocess's start (`steptrail --help`: interpreter and imports).
    figures["cli_start_s"] = min(timed_subprocess(["--help"], env, 60)["s"] for _ in range(3))
    for key in ("verify", "rebuild_run_index", "rebuild_reporting"):
        net = max(0.0, figures[f"{key}_s"] - figures["cli_start_s"])
        figures[f"{key}_us_per_run"] = 1e6 * net / size
    return figures


def short_phases(url: str, cfg: argparse.Namespace) -> dict[str, float]:
    """The hot path, the reaper, the reads and the purge on the database at `url`, in that
    order (the purge last: the reads' listing must see the old runs)."""
    figures: dict[str, float] = {}
    with open_runtime(settings=Settings(database_url=url, log_level="warning")) as rt:
        figures.update(hot_path(rt, cfg.runs, cfg.concurrency))
        figures.update(reaper(rt, cfg.stale))
        figures.update(reads(rt, command_env(url), cfg.repeat))
        figures.update(purge(rt))
    return figures


@contextmanager
def copied(url: str, cfg: argparse.Namespace) -> Iterator[str]:
    """A copy of the database at `url` (nothing may be connected to it), removed after:
    PostgreSQL `CREATE DATABASE … TEMPLATE`, SQLite's online backup."""
    if url.startswith("sqlite"):
        source = Path(url.removeprefix("sqlite:///"))
        target = source.with_name(f"{source.stem}-copy{source.suffix}")
        with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
            src.backup(dst)
        try:
            yield f"sqlite:///{target}"
        finally:
            _remove_sqlite(target)
        return
    original = url.rsplit("/", 1)[1]
    name = f"{original}_copy"
    _drop_database(cfg, name)
    with psycopg.connect(f"{cfg.pg.rstrip('/')}/postgres", autocommit=True) as conn:
        create = sql.SQL("CREATE DATABASE {} TEMPLATE {}")
        conn.execute(create.format(sql.Identifier(name), sql.Identifier(original)))
    try:
        yield f"{cfg.pg.rstrip('/')}/{name}"
    finally:
        _drop_database(cfg, name)


def _remove_sqlite(path: Path) -> None:
    """A SQLite database file and its -wal and -shm files."""
    for p in path.parent.glob(path.name + "*"):
        p.unlink()


def _drop_database(cfg: argparse.Namespace, name: str) -> None:
    with psycopg.connect(f"{cfg.pg.rstrip('/')}/postgres", autocommit=True) as conn:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(drop.format(sql.Identifier(name)))


def purge(rt: Runtime, batch: int = 100) -> dict[str, float]:
    """Purge the old runs; time per run, and apart the store's `after_purge` (PostgreSQL:
    VACUUM of the purged tables; SQLite: a WAL checkpoint), whose cost follows the tables'
    size, not the runs purged."""
    store = rt.store
    after_purge = store.after_purge
    spent = {"after": 0.0}

    def timed_after_purge() -> None:
        started = time.perf_counter()
        after_purge()
        spent["after"] += time.perf_counter() - started

    store.after_purge = timed_after_purge  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        report = rt.purge(PURGE_DAYS, batch=batch)
        seconds = time.perf_counter() - started
    finally:
        del store.after_purge
    n = max(1, report.total)
    return {
        "purged": report.total,
        "purge_ms_per_run": 1000 * seconds / n,
        "purge_batches_ms_per_run": 1000 * (seconds - spent["after"]) / n,
        "after_purge_s": spent["after"],
    }


# -- databases -------------------------------------------------------------------------------


@contextmanager
def database(
    backend: str, size: int, cfg: argparse.Namespace, folder: Path, tag: str = ""
) -> Iterator[str]:
    if backend == "sqlite":
        path = folder / f"scale-{size}{tag}.db"
        yield f"sqlite:///{path}"
        if not cfg.keep:
            _remove_sqlite(path)
        return
    name = f"steptrail_scale_{os.getpid()}_{size}{tag}"
    _drop_database(cfg, name)
    with psycopg.connect(f"{cfg.pg.rstrip('/')}/postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"{cfg.pg.rstrip('/')}/{name}"
    finally:
        if not cfg.keep:
            _drop_database(cfg, name)


# -- report ----------------------------------------------------------------------------------

ROWS = [
    ("load_s", "build: bulk load (s)", "{:.1f}", None),
    ("project_s", "build: views caught up (s)", "{:.1f}", None),
    ("bytes_per_run", "database size per run (bytes)", "{:,.0f}", None),
    ("enqueue_many_per_s", "enqueue_many (runs/s)", "{:,.0f}", None),
    ("drain_per_s", "claim + step + complete (runs/s)", "{:,.0f}", "≥ 1/1.2 of the smallest"),
    ("reap_ms_per_run", "reap of stale runs (ms/run)", "{:.3f}", "≤ 1.2"),
    ("open_s", "open a runtime (s, every command)", "{:.3f}", None),
    ("stats_s", "stats (s, in-process CLI)", "{:.3f}", "≤ 1.5"),
    ("runs_s", "runs (s)", "{:.3f}", "≤ 1.5"),
    ("runs_failed_s", "runs --status failed (s)", "{:.3f}", "≤ 1.5"),
    ("show_s", "show of a settled run (s)", "{:.3f}", "≤ 1.5"),
    ("cli_start_s", "a subprocess's start (steptrail --help, s)", "{:.2f}", None),
    ("verify_s", "verify (s, subprocess)", "{:.1f}", None),
    ("verify_us_per_run", "verify (µs/run, net of the start)", "{:.0f}", "linear: ~1"),
    ("verify_rss_mb", "verify peak RSS (MB)", "{:.0f}", "flat"),
    ("rebuild_run_index_s", "rebuild run-index (s)", "{:.1f}", None),
    ("rebuild_run_index_us_per_run", "rebuild run-index (µs/run)", "{:.0f}", "linear: ~1"),
    ("rebuild_run_index_rss_mb", "rebuild run-index peak RSS (MB)", "{:.0f}", "flat"),
    ("rebuild_reporting_s", "rebuild reporting (s)", "{:.1f}", None),
    ("rebuild_reporting_us_per_run", "rebuild reporting (µs/run)", "{:.0f}", "linear: ~1"),
    ("rebuild_reporting_rss_mb", "rebuild reporting peak RSS (MB)", "{:.0f}", "flat"),
    ("purge_ms_per_run", "purge (ms/run, all of it)", "{:.3f}", "≤ 1.5"),
    ("purge_batches_ms_per_run", "purge: the batches (ms/run)", "{:.3f}", None),
    ("after_purge_s", "purge: after_purge, once (s)", "{:.2f}", None),
]


def say(message: str) -> None:
    """Progress, on stderr (the report goes to stdout)."""
    print(message, file=sys.stderr, flush=True)


def ratio_table(backend: str, results: list[dict[str, Any]], rows: Any) -> list[str]:
    """A markdown table of `rows` ((key, label, format, target) each) with one column per
    size measured and the ratio largest / smallest; the bench scripts of issue 16 share it."""
    sizes = [r["size"] for r in results]
    head = " | ".join(f"{s:,} runs" for s in sizes)
    ratio = f"{sizes[-1]:,} / {sizes[0]:,}" if len(sizes) > 1 else "ratio"
    lines = [f"### {backend}", "", f"| figure | {head} | {ratio} | target |", "|---|"
             + "---:|" * (len(sizes) + 1) + "---|"]  # fmt: skip
    for key, label, fmt, target in rows:
        cells = [fmt.format(r[key]) if r.get(key) is not None else "—" for r in results]
        first, last = results[0].get(key), results[-1].get(key)
        ratio_cell = f"{last / first:.2f}x" if first and last and len(results) > 1 else "—"
        lines.append(f"| {label} | {' | '.join(cells)} | {ratio_cell} | {target or ''} |")
    return lines


Measure = Callable[[str, int, argparse.Namespace, Callable[[str], None]], dict[str, Any]]


def measure_sizes(
    cfg: argparse.Namespace, prefix: str, measure: Measure
) -> tuple[dict[str, list[dict[str, Any]]], tuple[float, float], float]:
    """`measure` on a database of every size in `cfg.sizes` on every backend of
    `cfg.backends` (built by `database`): the results per backend, the load average at the
    start and the end, and the seconds it all took."""
    sizes = sorted(int(s.replace("_", "")) for s in cfg.sizes.split(","))
    backends = [b.strip() for b in cfg.backends.split(",") if b.strip()]
    load = os.getloadavg()
    say(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; sizes {sizes}")
    results: dict[str, list[dict[str, Any]]] = {}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        for backend in backends:
            for size in sizes:
                with database(backend, size, cfg, Path(tmp)) as url:
                    results.setdefault(backend, []).append(measure(url, size, cfg, say))
    return results, (load[0], os.getloadavg()[0]), time.time() - started


def table(backend: str, results: list[dict[str, Any]]) -> str:
    lines = ratio_table(backend, results, ROWS)
    clean = ", ".join(f"{r['size']:,}: {'clean' if r.get('verify_clean') else 'NOT CLEAN'}"
                      for r in results)  # fmt: skip
    lines += ["", f"verify after the build: {clean}; purged: "
              + ", ".join(f"{int(r.get('purged', 0)):,}" for r in results)]  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,1000000", help="history sizes (runs)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg", default=os.environ.get(
        "STEPTRAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432"))  # fmt: skip
    parser.add_argument("--runs", type=int, default=2000, help="hot-path backlog drained")
    parser.add_argument("--concurrency", "-c", type=int, default=4)
    parser.add_argument("--stale", type=int, default=1000, help="stale runs reaped")
    parser.add_argument("--purge", type=int, default=1000, help="old runs purged")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions of each read")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of the short phases (hot path, reaper, reads, purge), each on a copy of "
        "the built database; their medians are reported",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="per maintenance command")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--json", type=Path, help="write every figure here")
    cfg = parser.parse_args()
    if cfg.rounds < 1:
        parser.error("--rounds must be at least 1")
    results, load, seconds = measure_sizes(cfg, "steptrail-scale-", measure)
    report = [
        f"Scale benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, load "
        f"average {load[0]:.2f} at the start and {load[1]:.2f} at the end, "
        f"{seconds:.0f} s in all; hot path: {cfg.runs:,} runs, -c "
        f"{cfg.concurrency}; reaper: {cfg.stale:,} stale runs; purge: {cfg.purge:,} runs"
        + (
            f"; these short phases: the median of {cfg.rounds} rounds, each on a copy of the"
            " built database."
            if cfg.rounds > 1
            else "."
        ),
        "",
    ]
    for backend, rows in results.items():
        report += [table(backend, rows), ""]
    print("\n".join(report))
    if cfg.json:
        cfg.json.write_text(json.dumps({
            "results": results,
            "environment": {
                "cpus": os.cpu_count(), "load_start": load[0], "load_end": load[1],
                "python": platform.python_version(), "platform": platform.platform(),
                "max_rss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            },
            "config": {k: str(v) for k, v in vars(cfg).items()},
        }, indent=2, default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
