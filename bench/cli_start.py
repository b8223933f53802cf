"""How long the `steptrail` command takes to start (ADR 0043).

Runs each command line as a fresh subprocess `--repeat` times and reports the median wall
time, next to `python -c pass` (the interpreter's own floor) measured in the same run:

- `steptrail --help`
- `steptrail stats --help`
- `steptrail stats` on a small SQLite database (a few runs; opening the runtime, bringing the
  views up and printing: what a command costs beyond its start)
- `python -c "import steptrail"`

With `--compare PYTHON` (another checkout's interpreter, e.g. main's `.venv/bin/python`) every
command also runs under that interpreter, interleaved with this one's, and the table adds the
ratio of the two (the same load for both).

    python bench/cli_start.py                   # 15 of each
    python bench/cli_start.py --repeat 31 --json out.json
    python bench/cli_start.py --compare ../main/.venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def medians(variants: list[list[str]], env: dict[str, str], repeat: int) -> list[float]:
    """The median wall time of each command line, the variants interleaved run by run."""
    times: list[list[float]] = [[] for _ in variants]
    for _ in range(repeat):
        for i, argv in enumerate(variants):
            times[i].append(wall(argv, env))
    return [statistics.median(t) for t in times]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", metavar="FILE", help="Also write the figures as JSON.")
    parser.add_argument(
        "--compare", metavar="PYTHON", help="Also time every command under this interpreter."
    )
    cfg = parser.parse_args()
    python = sys.executable
    steptrail = [python, "-m", "steptrail"]
    out = Path(cfg.json).resolve() if cfg.json else None  # before the chdir below
    with tempfile.TemporaryDirectory() as folder:
        # `python -m` puts the working directory first on sys.path: run from an empty one, so
        # that each interpreter imports its own checkout's steptrail, not this folder's.
        os.chdir(folder)
        url = f"sqlite:///{Path(folder) / 'small.db'}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
        env.update(STEPTRAIL_DATABASE_URL=url, STEPTRAIL_LOG_LEVEL="warning")
        subprocess.run([*steptrail, "migrate"], env=env, check=True, capture_output=True)
        for _ in range(3):
            subprocess.run(
                [*steptrail, "enqueue", "scripted", "--request", '{"steps": 2}'],
                env=env,
                check=True,
                capture_output=True,
            )
        subprocess.run([*steptrail, "work", "--burst"], env=env, check=True, capture_output=True)
        cases = {
            "python -c pass": [python, "-c", "pass"],
            "python -c 'import steptrail'": [python, "-c", "import steptrail"],
            "steptrail --help": [*steptrail, "--help"],
            "steptrail stats --help": [*steptrail, "stats", "--help"],
            "steptrail stats (small SQLite db)": [*steptrail, "stats"],
        }
        load = os.getloadavg()
        figures: dict[str, float] = {}
        compared: dict[str, float] = {}
        for name, argv in cases.items():
            variants = [argv]
            if cfg.compare:
                variants.append([cfg.compare, *argv[1:]])
            for variant in variants:  # warm the file cache and the bytecode
                subprocess.run(variant, env=env, capture_output=True, check=True)
            found = medians(variants, env, cfg.repeat)
            figures[name] = found[0]
            if cfg.compare:
                compared[name] = found[1]
    end = os.getloadavg()
    floor = figures["python -c pass"]
    print(
        f"median of {cfg.repeat} starts; load average {load[0]:.2f} at the start, "
        f"{end[0]:.2f} at the end"
    )
    head = f"{'command':<36} {'seconds':>8} {'- python':>9} {'x python':>9}"
    if cfg.compare:
        head += f" {'compared':>9} {'this/that':>9}"
    print(head)
    for name, seconds in figures.items():
        line = f"{name:<36} {seconds:>8.3f} {seconds - floor:>9.3f} {seconds / floor:>8.1f}x"
        if cfg.compare:
            line += f" {compared[name]:>9.3f} {seconds / compared[name]:>8.2f}x"
        print(line)
    if out is not None:
        out.write_text(
            json.dumps(
                {
                    "repeat": cfg.repeat,
                    "loadavg": {"start": load, "end": end},
                    "seconds": figures,
                    "compared": {"python": cfg.compare, "seconds": compared},
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
