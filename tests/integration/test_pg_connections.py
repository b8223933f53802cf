"""Where a PostgreSQL store's connections come from (ADR 0056): a pool for a long-lived
process, one kept connection for a one-shot command, with another opened only while that one
is busy, and the pool's care on a connection's return (a broken one dropped, a transaction
left open rolled back)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from steptrail.domain.errors import StoreUnavailable
from steptrail.infrastructure.factory import open_store
from steptrail.infrastructure.postgres import PostgresRunStore


def backends(url: str) -> set[int]:
    """The server processes connected to the database at `url`, besides this look-up's."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return {int(r[0]) for r in rows}


def gone(url: str, pids: set[int]) -> bool:
    """Whether none of `pids` is connected any more: a server process leaves the activity
    view a moment after its client closed, so this waits for that (ten seconds at most)."""
    for _ in range(200):
        if not pids & backends(url):
            return True
        time.sleep(0.05)
    return False


def pid_of(store: PostgresRunStore) -> int:
    with store._connection() as conn:
        row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
    assert row is not None
    return int(row["pid"])


@pytest.fixture
def one_shot(pg_url: str) -> Iterator[PostgresRunStore]:
    store = open_store(pg_url, one_shot=True)
    assert isinstance(store, PostgresRunStore)
    yield store
    store.close()


def test_a_one_shot_store_holds_one_connection_and_a_pooled_one_its_pool(pg_url: str) -> None:
    """Opened one-shot, the store is connected once (its check of the server is that
    connection); pooled, it holds `pool_size` connections."""
    before = backends(pg_url)
    store = open_store(pg_url, one_shot=True)
    try:
        assert len(backends(pg_url) - before) == 1
        assert store.pending_migrations() == []
        assert len(backends(pg_url) - before) == 1
    finally:
        store.close()
    assert gone(pg_url, backends(pg_url) - before)
    pooled = open_store(pg_url, pool_size=3)
    try:
        assert len(backends(pg_url) - before) == 3
    finally:
        pooled.close()


def test_a_use_inside_another_gets_a_second_connection_closed_after_it(
    one_shot: PostgresRunStore, pg_url: str
) -> None:
    kept = pid_of(one_shot)
    with one_shot._connection() as outer:
        row = outer.execute("SELECT pg_backend_pid() AS pid").fetchone()
        assert row is not None
        assert row["pid"] == kept
        inner = pid_of(one_shot)
        assert inner != kept
    assert gone(pg_url, {inner})
    assert pid_of(one_shot) == kept


def test_another_thread_gets_its_own_connection_while_the_kept_one_is_busy(
    one_shot: PostgresRunStore,
) -> None:
    kept = pid_of(one_shot)
    seen: list[int] = []
    with one_shot._connection():
        thread = threading.Thread(target=lambda: seen.append(pid_of(one_shot)))
        thread.start()
        thread.join(timeout=30)
    assert len(seen) == 1
    assert seen[0] != kept


def test_a_broken_connection_fails_its_statement_and_the_next_use_connects_again(
    one_shot: PostgresRunStore, pg_url: str
) -> None:
    """As with the pool (no check per checkout), a connection the server dropped fails the
    next statement with StoreUnavailable; it is not reused, the use after that works."""
    kept = pid_of(one_shot)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (kept,))
    with pytest.raises(StoreUnavailable):
        pid_of(one_shot)
    again = pid_of(one_shot)
    assert again != kept
    assert one_shot.pending_migrations() == []


def test_a_transaction_left_open_is_rolled_back_when_the_connection_is_returned(
    one_shot: PostgresRunStore,
) -> None:
    with one_shot._connection() as conn:
        conn.autocommit = False
        conn.execute("CREATE TEMPORARY TABLE left_open (x int)")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    with one_shot._connection() as conn:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        row = conn.execute("SELECT to_regclass('pg_temp.left_open') IS NULL AS gone").fetchone()
        assert row is not None
        assert row["gone"]


def test_closing_while_another_thread_uses_the_connection_closes_it_on_return(
    one_shot: PostgresRunStore, pg_url: str
) -> None:
    taken, release = threading.Event(), threading.Event()
    pids: list[int] = []

    def hold() -> None:
        with one_shot._connection() as conn:
            row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
            assert row is not None
            pids.append(int(row["pid"]))
            taken.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(30)
    one_shot.close()  # returns at once: the connection is in use
    assert pids[0] in backends(pg_url)
    release.set()
    thread.join(timeout=30)
    assert gone(pg_url, {pids[0]})
    with pytest.raises(StoreUnavailable):
        pid_of(one_shot)


def test_an_unreachable_server_is_named_by_a_one_shot_store_as_by_a_pooled_one() -> None:
    url = "postgresql://postgres@127.0.0.1:1/nowhere"
    for one_shot in (True, False):
        with pytest.raises(StoreUnavailable, match=r"cannot connect to PostgreSQL: .*refused"):
            open_store(url, one_shot=one_shot)
