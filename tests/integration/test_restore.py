"""A PostgreSQL database restored from a dump onto another server (ADR 0046).

The log's positions are (inserting transaction id, id). A dump keeps the old server's
transaction ids; on a server whose counter is lower they are "from the future": the feed
would not see those events until the counter passed them, then order new events before
them. `migrate` (and so every open with auto-migrate on) renumbers them first.

A restore is simulated by moving every saved position past this server's next transaction
id, exactly what restoring a dump from a busier server looks like.
"""

from __future__ import annotations

import psycopg
import pytest

from steptrail.infrastructure.factory import SchemaMissing
from steptrail.infrastructure.postgres import RESTORED, PostgresRunStore
from steptrail.runtime import Runtime
from tests.conftest import make_runtime

pytestmark = pytest.mark.usefixtures("pg_url")


def next_tx(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        query = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def restore_from_busier_server(url: str) -> int:
    """Shift every positive position past this server's counter; returns the shift."""
    shift = next_tx(url) + 1_000_000
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute("UPDATE steptrail_events SET tx_id = tx_id + %s WHERE tx_id > 0", (shift,))
        for table in ("steptrail_tracking", "steptrail_purged_events"):
            conn.execute(
                f"UPDATE {table} SET position_tx = position_tx + %s WHERE position_tx > 0",
                (shift,),
            )
    return shift


@pytest.fixture
def history(pg_url: str) -> str:
    """Completed and failed runs, the views caught up with half of them, a purged run."""
    rt = make_runtime(pg_url)
    try:
        for _ in range(4):
            rt.enqueue("scripted", {"steps": 2})
        rt.work(burst=True)
        rt.project()
        for _ in range(4):
            rt.enqueue("scripted", {"steps": 1, "fail": {"class": "auth", "at": 1}})
        rt.work(burst=True)  # the views are now behind by these four runs
    finally:
        rt.close()
    return pg_url


def feed_keys(rt: Runtime) -> list[tuple[object, int | None]]:
    out: list[tuple[object, int | None]] = []
    after = (0, 0)
    while entries := rt.events(after=after, limit=500):
        out += [(e.run_id, e.version) for e in entries]
        after = entries[-1].position
    return out


def test_restore__positions_renumbered_on_open_feed_order_kept(history: str) -> None:
    before = make_runtime(history)
    try:
        order = feed_keys(before)
    finally:
        before.close()
    assert len(order) > 8
    restore_from_busier_server(history)

    store = PostgresRunStore(history)
    try:
        assert store.pending_migrations() == [RESTORED]
    finally:
        store.close()

    rt = make_runtime(history)  # auto-migrate renumbers
    try:
        assert rt.store.pending_migrations() == []
        assert feed_keys(rt) == order  # every event visible now, in the same order
        rt.project()  # the views resume where they stood: no event twice, none lost
        assert rt.verify() == []
        # New events sort after the restored ones, and the views fold them.
        run_id = rt.enqueue("scripted", {"steps": 1})
        rt.work(burst=True)
        after = feed_keys(rt)
        assert after[: len(order)] == order
        assert {k for k, _ in after[len(order) :]} == {run_id}
        rt.project()
        assert rt.verify() == []
    finally:
        rt.close()


def test_restore__auto_migrate_off_refuses_until_migrate(history: str) -> None:
    restore_from_busier_server(history)
    with pytest.raises(SchemaMissing):
        make_runtime(history, auto_migrate=False)
    store = PostgresRunStore(history)
    try:
        assert store.migrate() == [RESTORED]
        assert store.migrate() == []  # once
    finally:
        store.close()
    rt = make_runtime(history, auto_migrate=False)
    rt.close()


def test_restore__server_counter_advanced_when_the_log_has_more_transactions(
    pg_url: str,
) -> None:
    """The renumbered positions must all sort before any transaction this server will run:
    when the log holds more transactions than the server has run, ids are used up first."""
    store = PostgresRunStore(pg_url)
    try:
        start = next_tx(pg_url)
        store._advance_tx_ids(start + 300)
        assert next_tx(pg_url) > start + 300
    finally:
        store.close()
