"""A/B of the idle worker's wait (ADR 0082) at a small backlog, in one process: bench/waits.py's
wake-up drain with the fixed poll (`Worker._idle_wait` returning `poll_interval`, the rule
before ADR 0082) and with the due-time wait, interleaved over two rounds on both backends.

    python bench/waits_ab.py              # 200 sleepers of 2 s; bench/results-waits-ab-200.json
    python bench/waits_ab.py --runs 500 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import waits

from steptrail.workers.worker import Worker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200, help="sleeping runs (200)")
    parser.add_argument("--pg", default=waits.DEFAULT_PG)
    parser.add_argument("--json", type=Path, help="also write every round to this JSON file")
    args = parser.parse_args(argv)
    due = Worker._idle_wait

    def poll(self: Worker, agents: Any) -> float:
        return self.poll_interval

    variants = {"poll": poll, "due": due}
    out: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="steptrail-waits-ab-") as tmp:
        for rnd in range(2):
            for backend in ("sqlite", "postgres"):
                order = ["poll", "due"] if rnd == 0 else ["due", "poll"]
                for name in order:
                    Worker._idle_wait = variants[name]  # type: ignore[method-assign]
                    dbs = waits.Databases(backend, args.pg, Path(tmp))
                    try:
                        figures = waits.wake_lateness(dbs.new(), args.runs, 2.0, 16)
                    finally:
                        dbs.drop()
                        Worker._idle_wait = due  # type: ignore[method-assign]
                    out.setdefault(f"{backend}/{name}", []).append(figures)
                    print(
                        f"{backend} {name}: fall asleep {figures['fall_asleep_s']:.2f} s, "
                        f"lateness p50 {figures['lateness_p50_ms']:.0f} ms, "
                        f"p99 {figures['lateness_p99_ms']:.0f} ms"
                    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
