"""The `steptrail` command line: `steptrail --help` lists the commands.

The commands live in `runs`, `queues`, `people`, `signals`, `schedules`, `limits`, `views`,
`feed` and `checks`; importing them registers them on the one Typer app defined in `app`.
"""

from __future__ import annotations

import importlib

from steptrail import _startup
from steptrail.cli.app import cli, run_cli

__all__ = ["cli", "main"]

# Registration order is the order `--help` lists the commands in.
for _module in (
    "runs",
    "queues",
    "people",
    "signals",
    "schedules",
    "limits",
    "views",
    "feed",
    "checks",
):
    importlib.import_module(f"steptrail.cli.{_module}")


def main() -> None:
    _startup.pause()  # no-op under `python -m steptrail`, which paused before importing
    try:
        run_cli()
    finally:
        _startup.resume()
