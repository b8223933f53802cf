"""How long the `steptrail` command takes to start (ADR 0043).

Runs each command line as a fresh subprocess `--repeat` times and reports the median wall
time, next to `python -c pass` (the interpreter's own floor) measured in the same run:

- `steptrail --help`
- `steptrail stats --help`
- `steptrail stats` on a small SQLite database (a few runs; opening the runtime, bringing the
  views up and printing: what a command costs beyond its start)
- `python -c "import steptrail"`

    python bench/cli_start.py                   # 15 of each
    python bench/cli_start.py --repeat 31 --json out.json
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


def median_wall(argv: list[str], env: dict[str, str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
        )
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", metavar="FILE", help="Also write the figures as JSON.")
    cfg = parser.parse_args()
    python = sys.executable
    steptrail = [python, "-m", "steptrail"]
    with tempfile.TemporaryDirectory() as folder:
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
        for argv in cases.values():  # warm the file cache and the bytecode
            subprocess.run(argv, env=env, capture_output=True, check=True)
        figures = {name: median_wall(argv, env, cfg.repeat) for name, argv in cases.items()}
    floor = figures["python -c pass"]
    load = os.getloadavg()
    print(f"median of {cfg.repeat} starts; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'command':<36} {'seconds':>8} {'- python':>9} {'x python':>9}")
    for name, seconds in figures.items():
        print(f"{name:<36} {seconds:>8.3f} {seconds - floor:>9.3f} {seconds / floor:>8.1f}x")
    if cfg.json:
        Path(cfg.json).write_text(
            json.dumps({"repeat": cfg.repeat, "loadavg": load, "seconds": figures}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
