"""Where a PostgreSQL store's connections come from (ADR 0056): a pool for a long-lived
process, one kept connection for a one-shot command, with another opened only while that one
is busy, and the pool's care on a connection's return (a broken one dropped, a transaction
left open rolled back)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest

from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.infrastructure.factory import open_store
from steptrail.infrastructure.postgres import PostgresRunStore
from tests.conftest import make_runtime

T = TypeVar("T")


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


def pins_at_each_append(store: PostgresRunStore, pause_s: float = 0.0) -> list[int]:
    """How many threads keep a connection at each of `store`'s appends from now on (the
    list fills as the worker appends); each append waits `pause_s` first."""
    pins = store._connections._pins  # type: ignore[attr-defined]
    seen: list[int] = []
    original = store.append

    def append(run: Any, **kwargs: Any) -> Any:
        seen.append(len(pins))
        if pause_s:
            time.sleep(pause_s)
        return original(run, **kwargs)

    store.append = append  # type: ignore[method-assign]
    return seen


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


# -- a connection kept by a thread of the pooled store (ADR 0088) ---------------------------


@pytest.fixture
def pooled(pg_url: str) -> Iterator[PostgresRunStore]:
    store = open_store(pg_url, pool_size=2)
    assert isinstance(store, PostgresRunStore)
    yield store
    store.close()


def in_thread(fn: Callable[[], T]) -> T:
    """`fn()` on a thread of its own, which ends before this returns."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(timeout=30)
    assert len(out) == 1
    return out[0]


def test_a_pinned_thread_keeps_one_connection_and_an_unpinned_one_checks_out(
    pooled: PostgresRunStore,
) -> None:
    """A thread that pinned sends every statement on the one connection it took; a use
    nested in another takes another connection of the pool, and the kept one stays."""
    unpinned = {pid_of(pooled) for _ in range(4)}
    assert len(unpinned) == 2  # the pool hands its connections out in turn
    assert pooled.pin_connection()
    try:
        kept = pid_of(pooled)
        assert {pid_of(pooled) for _ in range(4)} == {kept}
        with pooled._connection():
            assert pid_of(pooled) != kept
        assert pid_of(pooled) == kept
    finally:
        pooled.unpin_connection()
    assert len({pid_of(pooled) for _ in range(4)}) == 2


def test_at_most_pool_size_threads_pin_and_an_ended_thread_gives_its_connection_back(
    pooled: PostgresRunStore,
) -> None:
    """Two of three threads may pin in a pool of two (the third checks out as before); a
    thread that ended without unpinning has its connection returned at the next pin or
    unpin, and the pool serves it again."""
    release = threading.Event()
    pinned: list[bool] = []
    lock = threading.Lock()

    def pin_and_wait() -> None:
        ok = pooled.pin_connection()
        with lock:
            pinned.append(ok)
        pid_of(pooled)
        release.wait(30)

    threads = [threading.Thread(target=pin_and_wait) for _ in range(2)]
    for thread in threads:
        thread.start()
    for _ in range(200):
        if len(pinned) == 2:
            break
        time.sleep(0.05)
    assert pinned == [True, True]
    assert not in_thread(pooled.pin_connection)  # a third: the two places are taken
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    assert pooled.pin_connection()  # the ended threads' places and connections are back
    pooled.unpin_connection()
    stats = pooled._connections.pool.get_stats()  # type: ignore[attr-defined]
    assert stats["pool_available"] == stats["pool_size"]


def test_a_pinned_connection_the_server_dropped_fails_its_statement_and_is_replaced(
    pooled: PostgresRunStore, pg_url: str
) -> None:
    """As with a checked-out connection (no check per use): the statement on a dropped
    kept connection raises StoreUnavailable, the connection goes back to the pool (which
    drops it), and the thread's next statement takes and keeps another."""
    assert pooled.pin_connection()
    try:
        kept = pid_of(pooled)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (kept,))
        assert gone(pg_url, {kept})
        with pytest.raises(StoreUnavailable):
            pid_of(pooled)
        again = pid_of(pooled)
        assert again != kept
        assert pid_of(pooled) == again
        assert pooled.pending_migrations() == []
    finally:
        pooled.unpin_connection()


def test_a_transaction_left_by_a_pinned_use_ends_as_the_pool_ends_it(
    pooled: PostgresRunStore,
) -> None:
    """A use that leaves its connection in a transaction has it committed (or, on an error,
    rolled back), as the pool's connection() does, and the connection goes back to the
    pool; the thread's next use starts idle."""

    def fail_in_a_transaction() -> None:
        with pooled._connection() as conn:
            conn.autocommit = False
            conn.execute("CREATE TEMPORARY TABLE kept_rolled_back (x int)")
            raise RuntimeError("the caller failed")

    assert pooled.pin_connection()
    try:
        with pooled._connection() as conn:
            conn.autocommit = False
            conn.execute("CREATE TEMPORARY TABLE kept_left_open (x int)")
        with pytest.raises(RuntimeError):
            fail_in_a_transaction()
        for _ in range(3):  # whichever connection each use gets
            with pooled._connection() as conn:
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                row = conn.execute(
                    "SELECT to_regclass('pg_temp.kept_rolled_back') IS NULL AS gone"
                ).fetchone()
                assert row is not None
                assert row["gone"]
    finally:
        pooled.unpin_connection()


def test_closing_while_a_pinned_connection_is_in_use_closes_it_on_return(
    pooled: PostgresRunStore, pg_url: str
) -> None:
    taken, release = threading.Event(), threading.Event()
    pids: list[int] = []

    def hold() -> None:
        assert pooled.pin_connection()
        pid_of(pooled)
        with pooled._connection() as conn:
            row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
            assert row is not None
            pids.append(int(row["pid"]))
            taken.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(30)
    pooled.close()
    assert pids[0] in backends(pg_url)
    release.set()
    thread.join(timeout=30)
    assert gone(pg_url, {pids[0]})
    with pytest.raises(StoreUnavailable):
        pid_of(pooled)


def test_a_worker_pins_while_it_works_and_gives_every_connection_back(pg_url: str) -> None:
    """A worker's dispatcher and slot threads keep connections while it runs (at most the
    pool's size), and none is kept once it stopped."""
    rt = make_runtime(pg_url)
    try:
        store = rt.store
        assert isinstance(store, PostgresRunStore)
        pins = store._connections._pins  # type: ignore[attr-defined]
        most = pins_at_each_append(store)
        for _ in range(12):
            rt.enqueue("scripted", {"steps": 1})
        report = rt.work(concurrency=3, burst=True)
        assert report.outcomes.get("completed") == 12
        assert 2 <= max(most) <= 4  # the dispatcher and slots; at most pool_size (4)
        assert not pins
        stats = store._connections.pool.get_stats()  # type: ignore[attr-defined]
        assert stats["pool_available"] == stats["pool_size"]
    finally:
        rt.close()


def test_a_worker_of_as_many_slots_as_the_pool_pins_them_all_and_its_dispatcher(
    pg_url: str,
) -> None:
    """A worker of 4 slots on a store opened with a pool of 4 keeps 5 connections (its
    dispatcher's and each slot's, ADR 0090): the places and the pool's bounds grow by one,
    so the lease keeper and the store's other users still find as many as before; and none
    is kept once it stopped."""
    rt = make_runtime(pg_url)
    try:
        store = rt.store
        assert isinstance(store, PostgresRunStore)
        pool = store._connections.pool  # type: ignore[attr-defined]
        before = (pool.min_size, pool.max_size)
        pins = store._connections._pins  # type: ignore[attr-defined]
        # Each append pauses, so the slots overlap and all of them hold their pins at once.
        seen = pins_at_each_append(store, pause_s=0.01)
        for _ in range(24):
            rt.enqueue("scripted", {"steps": 2})
        report = rt.work(concurrency=4, burst=True)
        assert report.outcomes.get("completed") == 24
        assert max(seen) == 5
        assert (pool.min_size, pool.max_size) == (before[0] + 1, before[1] + 1)
        assert not pins
        stats = pool.get_stats()
        assert stats["pool_available"] == stats["pool_size"]
    finally:
        rt.close()


def test_the_places_to_keep_a_connection_grow_to_twice_the_pool_at_most(
    pooled: PostgresRunStore,
) -> None:
    """A reservation past twice the size the store was opened with (an async worker of a
    thousand slots) grows the pool no further, and one for fewer places than it has
    changes nothing."""
    pool = pooled._connections.pool  # type: ignore[attr-defined]
    opened = (pool.min_size, pool.max_size)
    pooled.reserve_connections(1)
    assert (pool.min_size, pool.max_size) == opened
    pooled.reserve_connections(1000)
    grown = (opened[0] * 2, opened[1] + opened[0])
    assert (pool.min_size, pool.max_size) == grown
    pooled.reserve_connections(1000)
    assert (pool.min_size, pool.max_size) == grown
    assert pooled._connections._most == opened[0] * 2  # type: ignore[attr-defined]


# -- kept cursors of the hot-path statements (ADR 0091) ------------------------------------------


def kept_cursors(store: PostgresRunStore) -> dict[str, psycopg.Cursor[Any]]:
    """The cursors the calling thread's pinned connection keeps, by query name."""
    with store._connection() as conn:
        kept = conn.__dict__.get("_steptrail_kept_cursors", {})
    names = {query: name for name, query in store.q.items()}
    return {names[query]: cursor for query, cursor in kept.items()}


def claimed_here(rt: Any) -> Any:
    claimed = rt.store.claim(holder="test-holder", lease_ms=30_000, agents=["scripted"])
    assert claimed is not None
    return claimed.run


def step(run: Any, seq_name: str) -> None:
    run.record_step(
        kind="llm", name=seq_name, duration_ms=0, payload={"n": seq_name}, tokens=1, cost=0
    )


@pytest.fixture
def pinned(pg_url: str) -> Iterator[tuple[Any, PostgresRunStore]]:
    """A runtime on PostgreSQL whose store's connection this thread keeps, and the store."""
    rt = make_runtime(pg_url)
    store = rt.store
    assert isinstance(store, PostgresRunStore)
    assert store.pin_connection()
    try:
        yield rt, store
    finally:
        store.unpin_connection()
        rt.close()


def test_a_connection_keeps_one_cursor_per_hot_statement_and_runs_it_again(
    pinned: tuple[Any, PostgresRunStore],
) -> None:
    """The claim and the append each run on a cursor their connection keeps: the second
    append runs on the first one's cursor, and what it wrote is in the log."""
    rt, store = pinned
    rt.enqueue("scripted", {"steps": 2})
    rt.enqueue("scripted", {"steps": 2})
    first = store.claim_batch(holder="h", lease_ms=30_000, agents=["scripted"], limit=1)
    second = store.claim_batch(holder="h", lease_ms=30_000, agents=["scripted"], limit=1)
    assert len(first) == len(second) == 1
    assert first[0].run.id != second[0].run.id
    run = first[0].run
    step(run, "one")
    store.append(run)
    cursor = kept_cursors(store)["append_one"]
    step(run, "two")
    store.append(run)
    kept = kept_cursors(store)
    assert kept["append_one"] is cursor
    assert "claim" in kept
    loaded = store.load(run.id)
    assert loaded is not None
    assert loaded.version == run.version
    names = [getattr(e.event, "name", None) for e in store.history(run.id)]
    assert [n for n in names if n][-2:] == ["one", "two"]


def test_a_fenced_append_leaves_the_kept_cursor_usable_for_the_owner(
    pinned: tuple[Any, PostgresRunStore],
) -> None:
    """A zombie's stale append fails its fence (VersionConflict) on the same connection and
    cursor the owner uses; the owner's next append on that cursor lands, and the zombie's
    step is not in the log."""
    rt, store = pinned
    rt.enqueue("scripted", {"steps": 2})
    owner = claimed_here(rt)
    zombie = store.load(owner.id)
    assert zombie is not None
    assert zombie.version == owner.version
    step(owner, "owner-1")
    store.append(owner)
    cursor = kept_cursors(store)["append_one"]
    step(zombie, "zombie")
    with pytest.raises(VersionConflict):
        store.append(zombie)
    step(owner, "owner-2")
    store.append(owner)
    assert kept_cursors(store)["append_one"] is cursor
    names = [getattr(e.event, "name", None) for e in store.history(owner.id)]
    assert "zombie" not in names
    assert [n for n in names if n][-2:] == ["owner-1", "owner-2"]


def test_a_dropped_connection_takes_its_cursors_and_the_next_append_lands_on_a_new_one(
    pinned: tuple[Any, PostgresRunStore], pg_url: str
) -> None:
    """The server drops the pinned connection: the append on its kept cursor fails with
    StoreUnavailable (nothing written), and the same append sent again runs on a new
    connection's own cursor and lands."""
    rt, store = pinned
    rt.enqueue("scripted", {"steps": 2})
    run = claimed_here(rt)
    step(run, "one")
    store.append(run)
    cursor = kept_cursors(store)["append_one"]
    dropped = pid_of(store)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (dropped,))
    assert gone(pg_url, {dropped})
    step(run, "two")
    with pytest.raises(StoreUnavailable):
        store.append(run)
    assert run.pending_events  # not marked committed: to be sent again
    store.append(run)
    assert pid_of(store) != dropped
    assert kept_cursors(store)["append_one"] is not cursor
    loaded = store.load(run.id)
    assert loaded is not None
    assert loaded.version == run.version
