"""How long the `steptrail` command takes to start (ADRs 0043, 0051, 0056).

Runs each command line as a fresh subprocess `--repeat` times and reports the median wall
time, next to `python -c pass` (the interpreter's own floor) measured in the same run:

- `python -c "import steptrail"`, `steptrail --help`, `steptrail stats --help`
- on a small SQLite database (a few finished runs): `stats`, `runs`, `show RUN`,
  `enqueue scripted` and `reap` — opening the runtime, doing the command's work and
  printing: what a command costs beyond its start
- with `--pg URL` (a PostgreSQL server, e.g. postgresql://postgres@127.0.0.1:5432; a
  scratch database is created there and dropped after), `stats`, `runs`, `show RUN`,
  `enqueue scripted` and `reap` on it

Bytecode: the subprocesses run without PYTHONDONTWRITEBYTECODE, so the first (warming) start
of each command writes the checkout's `__pycache__` if it is missing and the timed ones read
it, as an installed package does (pip compiles at install). In a checkout only ever run with
it set, there is no `__pycache__` and every start compiles the project's ~60 modules again
(`stats` ~0.6 s instead of ~0.33 s before ADR 0051), which says nothing about steptrail.

With `--compare PYTHON` (another checkout's interpreter, e.g. main's `.venv/bin/python`) every
command also runs under that interpreter, interleaved with this one's, and the table adds the
ratio of the two (the same load for both). Beside each wall time, the median CPU time (user +
system) of the command's process, which other work on the machine blurs less (a database
server's own work is not in it).

    python bench/cli_start.py                   # 15 of each
    python bench/cli_start.py --repeat 31 --json out.json
    python bench/cli_start.py --compare ../main/.venv/bin/python --pg postgresql://postgres@127.0.0.1:5432
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def wall(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds of one run of `argv`, and the CPU seconds (user + system) the process
    used: a figure that other work on the machine blurs less than the wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def medians(
    variants: list[list[str]], env: dict[str, str], repeat: int
) -> list[tuple[float, float]]:
    """The median wall and CPU time of each command line, the variants interleaved run by
    run."""
    times: list[list[tuple[float, float]]] = [[] for _ in variants]
    for _ in range(repeat):
        for i, argv in enumerate(variants):
            times[i].append(wall(argv, env))
    return [(statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for t in times]


def small_database(steptrail: list[str], env: dict[str, str], url: str) -> str:
    """Migrate `url`, run three two-step runs to the end; returns one run's id."""
    options = ["--database-url", url]
    subprocess.run([*steptrail, *options, "migrate"], env=env, check=True, capture_output=True)
    ids = []
    for _ in range(3):
        done = subprocess.run(
            [*steptrail, *options, "enqueue", "scripted", "--request", '{"steps": 2}'],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        ids.append(done.stdout.strip().splitlines()[-1])
    subprocess.run(
        [*steptrail, *options, "work", "--burst"], env=env, check=True, capture_output=True
    )
    return ids[0]


@contextmanager
def scratch_postgres(server: str | None) -> Iterator[str | None]:
    """A fresh database on the PostgreSQL server at `server` (dropped after), or None."""
    if server is None:
        yield None
        return
    import psycopg
    from psycopg import sql

    name = f"steptrail_cli_start_{os.getpid()}"
    admin = f"{server.rstrip('/')}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"{server.rstrip('/')}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", metavar="FILE", help="Also write the figures as JSON.")
    parser.add_argument(
        "--compare", metavar="PYTHON", help="Also time every command under this interpreter."
    )
    parser.add_argument(
        "--pg", metavar="URL", help="Also time commands on a scratch database on this server."
    )
    cfg = parser.parse_args()
    python = sys.executable
    steptrail = [python, "-m", "steptrail"]
    out = Path(cfg.json).resolve() if cfg.json else None  # before the chdir below
    with tempfile.TemporaryDirectory() as folder, scratch_postgres(cfg.pg) as pg_url:
        # `python -m` puts the working directory first on sys.path: run from an empty one, so
        # that each interpreter imports its own checkout's steptrail, not this folder's.
        os.chdir(folder)
        url = f"sqlite:///{Path(folder) / 'small.db'}"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("STEPTRAIL_") and k != "PYTHONDONTWRITEBYTECODE"
        }
        env.update(STEPTRAIL_DATABASE_URL=url, STEPTRAIL_LOG_LEVEL="warning")
        run_id = small_database(steptrail, env, url)
        cases = {
            "python -c pass": [python, "-c", "pass"],
            "python -c 'import steptrail'": [python, "-c", "import steptrail"],
            "steptrail --help": [*steptrail, "--help"],
            "steptrail stats --help": [*steptrail, "stats", "--help"],
            "steptrail stats (small SQLite db)": [*steptrail, "stats"],
            "steptrail runs (SQLite)": [*steptrail, "runs"],
            "steptrail show RUN (SQLite)": [*steptrail, "show", run_id],
            "steptrail enqueue (SQLite)": [*steptrail, "enqueue", "scripted"],
            "steptrail reap (SQLite)": [*steptrail, "reap"],
        }
        if pg_url is not None:
            pg_run = small_database(steptrail, env, pg_url)
            pg = [*steptrail, "--database-url", pg_url]
            cases["steptrail stats (PostgreSQL)"] = [*pg, "stats"]
            cases["steptrail runs (PostgreSQL)"] = [*pg, "runs"]
            cases["steptrail show RUN (PostgreSQL)"] = [*pg, "show", pg_run]
            cases["steptrail enqueue (PostgreSQL)"] = [*pg, "enqueue", "scripted"]
            cases["steptrail reap (PostgreSQL)"] = [*pg, "reap"]
        load = os.getloadavg()
        figures: dict[str, float] = {}
        compared: dict[str, float] = {}
        cpu: dict[str, float] = {}
        compared_cpu: dict[str, float] = {}
        for name, argv in cases.items():
            variants = [argv]
            if cfg.compare:
                variants.append([cfg.compare, *argv[1:]])
            for variant in variants:  # warm the file cache and write the bytecode
                subprocess.run(variant, env=env, capture_output=True, check=True)
            found = medians(variants, env, cfg.repeat)
            figures[name], cpu[name] = found[0]
            if cfg.compare:
                compared[name], compared_cpu[name] = found[1]
    end = os.getloadavg()
    floor = figures["python -c pass"]
    print(
        f"median of {cfg.repeat} starts; load average {load[0]:.2f} at the start, "
        f"{end[0]:.2f} at the end"
    )
    head = f"{'command':<36} {'seconds':>8} {'- python':>9} {'x python':>9} {'cpu s':>7}"
    if cfg.compare:
        head += f" {'compared':>9} {'this/that':>9} {'cpu that':>8} {'cpu t/t':>8}"
    print(head)
    for name, seconds in figures.items():
        line = (
            f"{name:<36} {seconds:>8.3f} {seconds - floor:>9.3f} {seconds / floor:>8.1f}x"
            f" {cpu[name]:>7.3f}"
        )
        if cfg.compare:
            line += (
                f" {compared[name]:>9.3f} {seconds / compared[name]:>8.2f}x"
                f" {compared_cpu[name]:>8.3f} {cpu[name] / compared_cpu[name]:>7.2f}x"
            )
        print(line)
    if out is not None:
        out.write_text(
            json.dumps(
                {
                    "repeat": cfg.repeat,
                    "loadavg": {"start": load, "end": end},
                    "seconds": figures,
                    "cpu_seconds": cpu,
                    "compared": {
                        "python": cfg.compare,
                        "seconds": compared,
                        "cpu_seconds": compared_cpu,
                    },
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
