"""The reporting half of bench/run.py: the ratios computed from one round's figures, the
summary over rounds, the printed markdown and the environment recorded in the JSON.

Kept apart from the measuring code so that each stays readable; bench/run.py is the entry
point (`python bench/run.py --help`).
"""

from __future__ import annotations

import os
import platform
import sqlite3
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from run import Config


RATIOS = {
    # name: (numerator, denominator, label)
    "ratio_pg_vs_procrastinate": (
        "steptrail_pg_drain",
        "procrastinate_drain",
        "steptrail-PG / Procrastinate (drain)",
    ),
    "ratio_pg_vs_procrastinate_enqueue": (
        "steptrail_pg_enqueue",
        "procrastinate_enqueue",
        "steptrail-PG / Procrastinate (enqueue vs defer)",
    ),
    "ratio_cpu_pg_vs_procrastinate": (
        "procrastinate_cpu_ms",
        "steptrail_pg_cpu_ms",
        "Procrastinate / steptrail-PG (CPU per run, worker + server; >1: steptrail cheaper)",
    ),
    "ratio_sqlite_vs_pg": (
        "steptrail_sqlite_drain",
        "steptrail_pg_drain",
        "steptrail-SQLite / steptrail-PG (drain)",
    ),
    "ratio_pg_vs_raw_skip_locked": (
        "steptrail_pg_drain",
        "raw_pg_drain",
        "steptrail-PG / raw SKIP LOCKED loop (drain)",
    ),
    "ratio_pg_append_vs_insert": (
        "steptrail_pg_append",
        "raw_pg_insert",
        "PG: step append / bare INSERT",
    ),
    "ratio_sqlite_append_vs_insert": (
        "steptrail_sqlite_append",
        "raw_sqlite_insert",
        "SQLite: step append / bare INSERT",
    ),
}


def ratios(figures: dict[str, float]) -> dict[str, float]:
    return {
        name: figures[a] / figures[b]
        for name, (a, b, _) in RATIOS.items()
        if a in figures and b in figures
    }


def summarise(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = [k for k in rounds[0] if all(k in r for r in rounds)]
    return {
        k: {
            "median": statistics.median(r[k] for r in rounds),
            "min": min(r[k] for r in rounds),
            "max": max(r[k] for r in rounds),
        }
        for k in keys
    }


FIGURES = [
    # (key, label, unit)
    ("steptrail_sqlite_drain", "steptrail SQLite: no-op runs drained", "runs/s"),
    ("steptrail_pg_drain", "steptrail PostgreSQL: no-op runs drained", "runs/s"),
    ("procrastinate_drain", "Procrastinate 3.10: no-op async tasks drained", "jobs/s"),
    ("raw_pg_drain", "raw PG queue: SKIP LOCKED claim + settle", "jobs/s"),
    ("steptrail_sqlite_enqueue", "steptrail SQLite: enqueue (1 thread)", "runs/s"),
    ("steptrail_pg_enqueue", "steptrail PostgreSQL: enqueue (1 thread)", "runs/s"),
    ("procrastinate_enqueue", "Procrastinate: defer (1 thread)", "jobs/s"),
    ("raw_pg_enqueue", "raw PG queue: single-row INSERT enqueue (1 thread)", "rows/s"),
    (
        "steptrail_sqlite_append",
        "steptrail SQLite: step append (record_step + append)",
        "appends/s",
    ),
    (
        "steptrail_pg_append",
        "steptrail PostgreSQL: step append (record_step + append)",
        "appends/s",
    ),
    ("raw_sqlite_insert", "bare SQLite INSERT loop (WAL, synchronous=NORMAL)", "inserts/s"),
    ("raw_pg_insert", "bare PostgreSQL INSERT loop (autocommit)", "inserts/s"),
    ("steptrail_sqlite_worker_cpu_ms", "steptrail SQLite: worker CPU per run", "ms"),
    ("steptrail_pg_worker_cpu_ms", "steptrail PostgreSQL: worker CPU per run", "ms"),
    ("steptrail_pg_server_cpu_ms", "steptrail PostgreSQL: server backend CPU per run", "ms"),
    ("procrastinate_worker_cpu_ms", "Procrastinate: worker CPU per job", "ms"),
    ("procrastinate_server_cpu_ms", "Procrastinate: server backend CPU per job", "ms"),
    ("raw_pg_worker_cpu_ms", "raw PG queue: worker CPU per job", "ms"),
    ("raw_pg_server_cpu_ms", "raw PG queue: server backend CPU per job", "ms"),
]


def _fmt(value: float) -> str:
    return f"{value:,.2f}" if value < 10 else f"{value:,.0f}"


def load_average() -> str:
    """The 1-minute load average: other work on the machine skews every figure."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def markdown(
    summary: dict[str, dict[str, float]], wire: dict[str, float], cfg: Config, load: str
) -> str:
    spread = cfg.rounds > 1
    head = "| Figure | Median | Unit |" + (" Min - max |" if spread else "")
    rule = "|---|---:|---|" + ("---:|" if spread else "")
    lines = [
        f"Shape: {cfg.processes} worker process(es) x concurrency {cfg.concurrency}; "
        f"N = {cfg.runs} runs/jobs, K = {cfg.appends} appends/inserts; {cfg.rounds} round(s); "
        f"{os.cpu_count()} CPUs, 1-min load average before/after: {load}"
        + ("; planner statistics: cold (no ANALYZE)." if cfg.cold_stats else "."),
        "",
        head,
        rule,
    ]
    for key, label, unit in FIGURES:
        if key not in summary:
            continue
        s = summary[key]
        row = f"| {label} | {_fmt(s['median'])} | {unit} |"
        if spread:
            row += f" {_fmt(s['min'])} - {_fmt(s['max'])} |"
        lines.append(row)
    lines += [
        "",
        "| Ratio (median of per-round ratios) | Value |" + (" Min - max |" if spread else ""),
        "|---|---:|" + ("---:|" if spread else ""),
    ]
    for name, (_, _, label) in RATIOS.items():
        if name not in summary:
            continue
        s = summary[name]
        row = f"| {label} | {s['median']:.2f}x |"
        if spread:
            row += f" {s['min']:.2f} - {s['max']:.2f} |"
        lines.append(row)
    if wire:
        lines += [
            "",
            "| PostgreSQL wire cost per operation | Round trips (syncs) | COMMITs |",
            "|---|---:|---:|",
        ]
        for op in ("enqueue", "enqueue_key_taken", "claim", "append"):
            lines.append(
                f"| {op} | {wire[f'{op}_round_trips']:.2f} | {wire[f'{op}_commits']:.2f} |"
            )
    return "\n".join(lines)


def environment(pg_version: str) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "postgres": pg_version,
        "sqlite": sqlite3.sqlite_version,
        "procrastinate": version("procrastinate"),
        "psycopg": version("psycopg"),
        "steptrail": version("steptrail"),
    }
