"""Run ids sort by creation time in the stores themselves (ADR 0052): SQLite keys runs by
the id's hex text, PostgreSQL by the uuid's bytes, and both must put the runs made earlier
first, whichever way a run was made (enqueue, enqueue_many, start)."""

from __future__ import annotations

import sqlite3
import time
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg

from steptrail.runtime import Runtime
from tests.conftest import make_runtime


def ids_in_key_order(rt: Runtime, table: str, column: str) -> list[UUID]:
    """The run ids of `table` in the order of its key, as the database sorts them."""
    url = rt.settings.database_url
    query = f"SELECT DISTINCT {column} FROM {table} ORDER BY {column}"
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            return [UUID(r[0]) for r in conn.execute(query)]
        finally:
            conn.close()
    with psycopg.connect(url) as pg:
        return [r[0] for r in pg.execute(query)]


def made_in_order(rt: Runtime) -> list[UUID]:
    """Runs made every way there is, each in a later millisecond than the one before."""
    made: list[UUID] = []

    def later() -> None:
        time.sleep(0.002)

    made.append(rt.enqueue("scripted", {"steps": 1}))
    later()
    made += rt.enqueue_many([{"agent": "scripted", "request": {"steps": 1}}])
    later()
    made.append(rt.start("scripted", {"steps": 1}).run_id)
    later()
    made.append(rt.enqueue("scripted", {"steps": 1}))
    return made


def test_run_ids__every_table_keyed_by_run_sorts_them_by_creation(db_url: str) -> None:
    rt = make_runtime(db_url)
    try:
        made = made_in_order(rt)
        assert all(run_id.version == 7 for run_id in made)
        rt.work(burst=True)
        rt.project()
        for table, column in (
            ("steptrail_runs", "run_id"),
            ("steptrail_events", "originator_id"),
            ("steptrail_view_run_summaries", "run_id"),
        ):
            assert ids_in_key_order(rt, table, column) == made, table
    finally:
        rt.close()


def test_run_ids__a_purge_takes_the_runs_at_the_low_end_of_the_keys(db_url: str) -> None:
    """The runs a purge removes (the oldest) are the lowest keys; what stays is the rest, in
    order, and the database verifies clean."""
    rt = make_runtime(db_url)
    try:
        made = made_in_order(rt)
        rt.work(burst=True)
        rt.project()
        store: Any = rt.store
        removed = store.purge_batch(
            category="agent_run",
            statuses=["completed", "failed", "cancelled"],
            cutoff=store.store_now() + timedelta(seconds=1),
            limit=2,
        )
        assert sorted(removed) == made[:2]
        assert ids_in_key_order(rt, "steptrail_runs", "run_id") == made[2:]
        assert rt.verify() == []
    finally:
        rt.close()
