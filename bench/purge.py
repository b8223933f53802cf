"""Purge benchmark: time per purged run at two database sizes, A/B on the same data (ADR 0052).

For each backend and each size (default 2,000 and 200,000 settled runs, the oldest `--purge`
runs 400 days old, built once by bench/scale.py's `build`), every trial purges those old runs
from a fresh copy of the built database (SQLite: a file copy, flushed to disk before the
trial; PostgreSQL: `CREATE DATABASE … TEMPLATE`), so every arm purges the same runs from the
same pages. Three arms, interleaved, `--repeat` times:

- **main**: random run ids (version 4) and the summaries' `(status, reason)` index put back
  on the copy: the code before ADR 0052;
- **0021**: random run ids, the current schema: a database made before ADR 0052, upgraded;
- **ordered**: run ids as the runtime now makes them (version 7, sorted by creation time),
  the current schema.

Each trial reports the purge's batches per run and, apart, `after_purge` (SQLite: the WAL
checkpoint; PostgreSQL: VACUUM of the purged tables). The table gives the median of the
trials and the ratio larger / smaller size per arm.

    flock /work/wt/bench.lock python bench/purge.py                      # both backends
    python bench/purge.py --backends sqlite --sizes 2000,200000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("STEPTRAIL_LOG_LEVEL", "warning")

import psycopg
import scale  # bench/scale.py: building databases, the timed purge, the table
from psycopg import sql

from steptrail.infrastructure.settings import Settings
from steptrail.runtime import open_runtime

OLD_INDEX = (
    "CREATE INDEX IF NOT EXISTS steptrail_view_run_summaries_status_idx"
    " ON steptrail_view_run_summaries (status, reason)"
)


def settings(url: str) -> Settings:
    return Settings(database_url=url, log_level="warning")


def build(url: str, size: int, old: int, ids: str) -> dict[str, float]:
    with open_runtime(settings=settings(url)) as rt:
        figures = scale.build(rt, size, old, scale.say, ids=ids)
        rt.store.after_purge()  # SQLite: fold the load's WAL in; PostgreSQL: VACUUM
    if url.startswith("postgres"):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
    return figures


@contextmanager
def copy_of(template: str, tmp: Path) -> Iterator[str]:
    """A copy of the built database, its bytes on disk (a trial must not pay for flushing
    the copy), removed afterwards."""
    if template.startswith("sqlite"):
        source = Path(template.removeprefix("sqlite:///"))
        target = tmp / "trial.db"
        shutil.copyfile(source, target)
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            yield f"sqlite:///{target}"
        finally:
            for p in tmp.glob("trial.db*"):
                p.unlink()
        return
    base, name = template.rsplit("/", 1)
    trial = f"{name}_trial"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(trial)))
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(trial), sql.Identifier(name)
            )
        )
    try:
        yield f"{base}/{trial}"
    finally:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(trial))
            )


def before_0021(url: str) -> None:
    """Put the index migration 0021 drops back, and leave the copy as settled as the
    template (checkpointed and on disk / vacuumed and analysed)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute(OLD_INDEX)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(OLD_INDEX)
        conn.execute("VACUUM ANALYZE steptrail_view_run_summaries")


def trial(template: str, arm: str, batch: int, tmp: Path) -> dict[str, float]:
    with copy_of(template, tmp) as url:
        if arm == "main":
            before_0021(url)
        with open_runtime(settings=settings(url)) as rt:
            return scale.purge(rt, batch=batch)


ARMS = ("main", "0021", "ordered")
IDS = {"main": "random", "0021": "random", "ordered": "ordered"}
LABELS = {
    "main": "random ids, (status, reason) index",
    "0021": "random ids, migration 0021",
    "ordered": "time-ordered ids, migration 0021",
}


def table(backend: str, sizes: list[int], runs: dict[tuple[int, str], list[dict]]) -> str:
    rows: list[dict[str, Any]] = []
    for size in sizes:
        row: dict[str, Any] = {"size": size}
        for arm in ARMS:
            trials = runs[(size, arm)]
            for key in ("purge_batches_ms_per_run", "purge_ms_per_run", "after_purge_s"):
                row[f"{arm}_{key}"] = statistics.median(t[key] for t in trials)
            row[f"{arm}_purged"] = trials[0]["purged"]
        rows.append(row)
    spec = []
    target = "≤ 1.5"
    for arm in ARMS:
        label = LABELS[arm]
        spec += [
            (f"{arm}_purged", f"{arm}: runs purged", "{:,}", None),
            (
                f"{arm}_purge_batches_ms_per_run",
                f"{arm}: batches (ms/run), {label}",
                "{:.3f}",
                target,
            ),
            (f"{arm}_after_purge_s", f"{arm}: after_purge, once (s)", "{:.3f}", None),
            (f"{arm}_purge_ms_per_run", f"{arm}: all of it (ms/run)", "{:.3f}", None),
        ]
    return "\n".join(scale.ratio_table(backend, rows, spec))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="2000,200000", help="two database sizes (runs)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg", default=os.environ.get(
        "STEPTRAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432"))  # fmt: skip
    parser.add_argument("--purge", type=int, default=200, help="old runs purged at each size")
    parser.add_argument("--batch", type=int, default=100, help="purge batch size")
    parser.add_argument("--repeat", type=int, default=3, help="trials of each arm and size")
    parser.add_argument("--keep", action="store_true", help="keep the built databases")
    cfg = parser.parse_args()
    sizes = sorted(int(s.replace("_", "")) for s in cfg.sizes.split(","))
    load = os.getloadavg()
    started = time.time()
    out = []
    with tempfile.TemporaryDirectory(prefix="steptrail-purge-") as tmp:
        for backend in [b.strip() for b in cfg.backends.split(",") if b.strip()]:
            with ExitStack() as stack:
                templates = {}
                for size in sizes:
                    for ids in ("random", "ordered"):
                        url = stack.enter_context(
                            scale.database(backend, size, cfg, Path(tmp), tag=f"_{ids}")
                        )
                        scale.say(f"{backend} {size:,}: building, {ids} ids")
                        build(url, size, min(cfg.purge, size // 2), ids)
                        templates[(size, ids)] = url
                runs: dict[tuple[int, str], list[dict]] = {}
                for rep in range(cfg.repeat):
                    for size in sizes:
                        for arm in ARMS:
                            template = templates[(size, IDS[arm])]
                            got = trial(template, arm, cfg.batch, Path(tmp))
                            runs.setdefault((size, arm), []).append(got)
                            scale.say(
                                f"{backend} {size:,} {arm} #{rep}: batches "
                                f"{got['purge_batches_ms_per_run']:.3f} ms/run, after_purge "
                                f"{got['after_purge_s']:.3f} s"
                            )
                out.append(table(backend, sizes, runs))
    print(
        f"\nPurge benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.2f} at the start and {os.getloadavg()[0]:.2f} at the end, "
        f"{time.time() - started:.0f} s in all; {cfg.purge:,} runs purged per trial in "
        f"batches of {cfg.batch}, median of {cfg.repeat} trials.\n"
    )
    print("\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
