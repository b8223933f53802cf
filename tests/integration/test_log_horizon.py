"""The log's read horizon on PostgreSQL is per database (ADR 0047).

Readers (views, projections, the feed) read only transactions that can no longer add to the
log. That used to be the oldest transaction running anywhere on the server, so any open
transaction of any application held every steptrail reader back. Now only this database's
writers of the log hold it, and a writer in flight with a lower id is never passed.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from steptrail.infrastructure.postgres import PostgresRunStore
from steptrail.runtime import Runtime
from tests.conftest import PG_ADMIN_URL, make_runtime


@pytest.fixture
def rt(pg_url: str) -> Iterator[Runtime]:
    runtime = make_runtime(pg_url)
    yield runtime
    runtime.close()


def folded(rt: Runtime) -> set[object]:
    rt.project()
    return {s.run_id for s in rt.views.summaries()}


def open_transaction_with_id(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A connection in a transaction that has been given a transaction id (as any write
    does) and stays open."""
    conn = psycopg.connect(url)
    conn.execute("SELECT pg_current_xact_id()")
    return conn


def test_horizon__another_databases_open_transaction_does_not_hold_the_views(
    rt: Runtime,
) -> None:
    idle = open_transaction_with_id(PG_ADMIN_URL)  # another database on the same server
    try:
        ids = {rt.enqueue("scripted", {"steps": 1}) for _ in range(3)}
        rt.work(burst=True)
        assert folded(rt) == ids
        assert rt.verify() == []
        assert len(rt.events(limit=100)) == 3 * 4  # Queued, Claimed, Step, Completed
    finally:
        idle.rollback()
        idle.close()


def test_horizon__a_non_writer_in_this_database_does_not_hold_the_views(
    rt: Runtime, pg_url: str
) -> None:
    report = open_transaction_with_id(pg_url)  # e.g. an operator's session, a report
    try:
        run_id = rt.enqueue("scripted", {"steps": 1})
        rt.work(burst=True)
        assert folded(rt) == {run_id}
    finally:
        report.rollback()
        report.close()


def test_horizon__a_writer_in_flight_is_never_passed(rt: Runtime, pg_url: str) -> None:
    """A writer of the log with a lower transaction id, still open while later writers
    commit, holds every reader back; when it commits, its event is read, not skipped."""
    early = rt.enqueue("scripted", {"steps": 1})
    store = rt.store
    assert isinstance(store, PostgresRunStore)
    run = store.load(early)
    assert run is not None
    run.cancel(actor="horizon-test", note=None)
    writer = psycopg.connect(pg_url)
    try:
        # The real append, in a transaction left open: it locked the run's row, got its id
        # and inserted Cancelled, which nobody can see yet.
        writer.execute(store.q["append"], store.append_params(run))
        later = {rt.enqueue("scripted", {"steps": 1}) for _ in range(3)}
        rt.work(burst=True)  # later transactions commit while the early one is open
        assert folded(rt) <= {early}  # nothing past the writer in flight
        assert {e.run_id for e in rt.events(limit=100)} <= {early}
        writer.commit()
    finally:
        writer.close()
    assert folded(rt) == later | {early}
    assert rt.get(early).status.value == "cancelled"
    assert rt.verify() == []
    feed = rt.events(limit=100)
    assert [e.version for e in feed if e.run_id == early] == [1, 2]  # Queued, Cancelled
