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


# bench/peers.py: steptrail against DBOS 3.4.0, same shape, same backend, same round.
PEER_SHAPES = {"noop": "no-op", "five_step": "five-step"}
PEER_BACKENDS = {"pg": "PostgreSQL", "sqlite": "SQLite"}
for _b, _backend in PEER_BACKENDS.items():
    for _s, _shape in PEER_SHAPES.items():
        RATIOS[f"ratio_{_b}_{_s}_vs_dbos"] = (
            f"peer_{_b}_steptrail_{_s}_drain",
            f"peer_{_b}_dbos_{_s}_drain",
            f"steptrail-{_backend} / DBOS-{_backend} ({_shape} drain)",
        )
        if _b == "pg":
            RATIOS[f"ratio_cpu_{_b}_{_s}_vs_dbos"] = (
                f"peer_{_b}_dbos_{_s}_cpu_ms",
                f"peer_{_b}_steptrail_{_s}_cpu_ms",
                f"DBOS / steptrail, {_backend} {_shape} (CPU per run, worker + server; "
                ">1: steptrail cheaper)",
            )
        else:
            RATIOS[f"ratio_cpu_{_b}_{_s}_vs_dbos"] = (
                f"peer_{_b}_dbos_{_s}_worker_cpu_ms",
                f"peer_{_b}_steptrail_{_s}_worker_cpu_ms",
                f"DBOS / steptrail, {_backend} {_shape} (worker CPU per run; "
                ">1: steptrail cheaper)",
            )
# The issue-31 targets the markdown checks: ratio name -> the least value that meets it.
TARGETS = {
    "ratio_pg_five_step_vs_dbos": 5.0,
    "ratio_sqlite_five_step_vs_dbos": 5.0,
    "ratio_pg_vs_procrastinate": 2.0,
}
# Latency targets, ms at p50: (backend, figure) -> bound.
LATENCY_TARGETS = {("pg", "enqueue_to_start_ms"): 5.0, ("sqlite", "enqueue_to_start_ms"): 2.0}
LATENCY_FIGURES = {
    "enqueue_to_start_ms": "enqueue -> first step started (idle worker, 4 slots)",
    "step_record_ms": "one recorded ctx.llm step (no-op call)",
    "approve_to_resume_ms": 'approve(resume="queue") -> resumed segment started',
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


for _b, _backend in PEER_BACKENDS.items():
    for _s, _shape in PEER_SHAPES.items():
        for _system, _name in (("steptrail", "steptrail"), ("dbos", "DBOS 3.4.0")):
            FIGURES.append(
                (
                    f"peer_{_b}_{_system}_{_s}_drain",
                    f"peer, {_name} {_backend}: {_shape} runs drained (1 process)",
                    "runs/s",
                )
            )
for _b, _backend in PEER_BACKENDS.items():
    for _s, _shape in PEER_SHAPES.items():
        for _system, _name in (("steptrail", "steptrail"), ("dbos", "DBOS")):
            key = "cpu_ms" if _b == "pg" else "worker_cpu_ms"
            what = "worker + server CPU" if _b == "pg" else "worker CPU"
            FIGURES.append(
                (
                    f"peer_{_b}_{_system}_{_s}_{key}",
                    f"peer, {_name} {_backend}: {_shape}, {what} per run",
                    "ms",
                )
            )


def _fmt(value: float) -> str:
    return f"{value:,.2f}" if value < 10 else f"{value:,.0f}"


def load_average() -> str:
    """The 1-minute load average: other work on the machine skews every figure."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def markdown(
    summary: dict[str, dict[str, float]],
    wire: dict[str, float],
    cfg: Config,
    load: str,
    latency: dict[str, Any] | None = None,
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
    lines += _headline(summary, cfg)
    if latency:
        lines += latency_table(latency)
    return "\n".join(lines)


def _headline(summary: dict[str, dict[str, float]], cfg: Config) -> list[str]:
    """The issue-31 comparisons: steptrail against DBOS and Procrastinate, with targets."""
    rows = [
        ("ratio_pg_five_step_vs_dbos", "five-step, PostgreSQL: steptrail / DBOS"),
        ("ratio_sqlite_five_step_vs_dbos", "five-step, SQLite: steptrail / DBOS"),
        ("ratio_pg_noop_vs_dbos", "no-op, PostgreSQL: steptrail / DBOS"),
        ("ratio_sqlite_noop_vs_dbos", "no-op, SQLite: steptrail / DBOS"),
        ("ratio_pg_vs_procrastinate", "no-op, PostgreSQL: steptrail / Procrastinate"),
    ]
    rows = [(k, label) for k, label in rows if k in summary]
    if not rows:
        return []
    out = [""]
    if cfg.peers:
        out += [
            f"Peers: N = {cfg.peer_runs} runs per drain, 1 worker process x concurrency "
            f"{cfg.concurrency} for both (Procrastinate: the drain above), DBOS queue polling "
            f"interval {cfg.dbos_poll} s.",
            "",
        ]
    out += [
        "| Comparison (median of per-round ratios) | Value | Min - max | Target | Met |",
        "|---|---:|---:|---:|---|",
    ]
    for key, label in rows:
        s = summary[key]
        target = TARGETS.get(key)
        met = "" if target is None else ("yes" if s["median"] >= target else "no")
        bound = "" if target is None else f">= {target:.0f}x"
        out.append(
            f"| {label} | {s['median']:.2f}x | {s['min']:.2f} - {s['max']:.2f} | {bound} | {met} |"
        )
    return out


def latency_table(latency: dict[str, Any]) -> list[str]:
    out = [
        "",
        "| Latency | Backend | p50 | p99 | Samples | Target (p50) | Met |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for backend, figures in latency.items():
        if not isinstance(figures, dict):
            continue
        for key, label in LATENCY_FIGURES.items():
            if key not in figures:
                continue
            f = figures[key]
            bound = LATENCY_TARGETS.get((backend, key))
            met = "" if bound is None else ("yes" if f["p50"] <= bound else "no")
            target = "" if bound is None else f"<= {bound:.0f} ms"
            out.append(
                f"| {label} | {PEER_BACKENDS.get(backend, backend)} | {f['p50']:.2f} ms "
                f"| {f['p99']:.2f} ms | {f['n']} | {target} | {met} |"
            )
    return out


def environment(pg_version: str) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "postgres": pg_version,
        "sqlite": sqlite3.sqlite_version,
        "procrastinate": version("procrastinate"),
        "dbos": version("dbos"),
        "psycopg": version("psycopg"),
        "steptrail": version("steptrail"),
    }
