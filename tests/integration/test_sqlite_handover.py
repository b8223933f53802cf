"""SQLite's cross-process write handover is bounded: a stopped process holding the write
turn makes other writers fail as on a store error (and so fence themselves), not freeze.
SQLite only: PostgreSQL has no such handover."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from steptrail.domain.errors import StoreUnavailable, VersionConflict
from steptrail.domain.run import Run
from steptrail.infrastructure.sqlite import SQLiteRunStore

HOLDER = """
import sys, time
from steptrail.infrastructure.sqlite import SQLiteRunStore
store = SQLiteRunStore(sys.argv[1])
with store._write():
    print("holding", flush=True)
    time.sleep(120)
"""


def test_handover__stopped_holder_gives_store_unavailable_in_time(tmp_path: Path) -> None:
    """With another process SIGSTOPped while it holds the write turn, an append fails with
    StoreUnavailable after the handover timeout; once the holder is gone, writes work."""
    url = f"sqlite:///{tmp_path / 'steptrail.db'}"
    store = SQLiteRunStore(url, handover_timeout=1.0)
    store.migrate()
    run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
    store.create(run, request=b"{}")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        holder.send_signal(signal.SIGSTOP)
        outcome: dict[str, Any] = {}

        def append() -> None:
            started = time.monotonic()
            run.cancel(actor="t")
            try:
                store.append(run)
                outcome["result"] = "appended"
            except StoreUnavailable:
                outcome["result"] = "unavailable"
            outcome["took"] = time.monotonic() - started

        writer = threading.Thread(target=append, daemon=True)
        writer.start()
        writer.join(15)
        assert not writer.is_alive(), "the writer froze behind the stopped process"
        assert outcome["result"] == "unavailable"
        assert 0.9 <= outcome["took"] < 5
        # A second attempt while it is still stopped fails the same way (no new waiter).
        with pytest.raises(StoreUnavailable):
            store.append(run)
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait(10)
    store.append(run)  # the holder is gone: the turn is free again
    assert store.load(run.id).status.value == "cancelled"
    store.close()


# -- the write turn is given back however a transaction ends (ADR 0055) -------------------------


def _claimed(store: SQLiteRunStore) -> Run:
    run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
    store.create(run, request=b"{}")
    claimed = store.claim(holder="w", lease_ms=60_000, agents=["a"])
    assert claimed is not None
    return claimed.run


def _turn_is_free(store: SQLiteRunStore) -> bool:
    """Nobody of this process holds the write turn (the mutex), and SQLite's write lock is
    free: another connection can take it at once."""
    if store._writer_mutex.locked():
        return False
    assert store.path is not None
    other = sqlite3.connect(store.path, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    except sqlite3.OperationalError:
        return False
    finally:
        other.close()
    return True


def _events(store: SQLiteRunStore, run: Run) -> int:
    return len(store.history(run.id))


def test_write_turn__stale_append_conflicts_writes_nothing_and_gives_the_turn_back(
    sqlite_url: str,
) -> None:
    """A stale writer's step append (the events' unique key refuses it inside the
    transaction) raises VersionConflict, leaves the log and the row as they were, and the
    next append of the live writer goes through."""
    store = SQLiteRunStore(sqlite_url)
    store.migrate()
    live = _claimed(store)
    zombie = store.load(live.id)
    assert zombie is not None
    live.record_step(kind="llm", name="one", duration_ms=1)
    store.append(live)
    before = (_events(store, live), store.row(live.id))
    zombie.record_step(kind="llm", name="stale", duration_ms=1)
    with pytest.raises(VersionConflict, match="appended to the run first"):
        store.append(zombie)
    assert (_events(store, live), store.row(live.id)) == before
    assert _turn_is_free(store)
    live.record_step(kind="llm", name="two", duration_ms=1)
    store.append(live)
    assert store.load(live.id).state == live.state  # type: ignore[union-attr]
    store.close()


def test_write_turn__conflict_found_at_commit_rolls_back_and_gives_the_turn_back(
    sqlite_url: str,
) -> None:
    """An append to a run whose index row is gone fails at COMMIT (the deferred foreign
    key): VersionConflict, the event it tried is not in the log, and the turn is free."""
    store = SQLiteRunStore(sqlite_url)
    store.migrate()
    run = _claimed(store)
    assert store.path is not None
    raw = sqlite3.connect(store.path, isolation_level=None)
    raw.execute("DELETE FROM steptrail_runs WHERE run_id = ?", (run.id.hex,))
    raw.close()
    events = _events(store, run)
    run.record_step(kind="llm", name="late", duration_ms=1)
    with pytest.raises(VersionConflict, match="no longer exists"):
        store.append(run)
    assert _events(store, run) == events
    assert _turn_is_free(store)
    other = _claimed(store)  # the next write goes through
    other.record_step(kind="llm", name="one", duration_ms=1)
    store.append(other)
    store.close()


def test_write_turn__an_error_in_the_body_rolls_back_and_goes_on_unchanged(
    sqlite_url: str,
) -> None:
    """An exception raised inside a write transaction reaches the caller as it was (not
    turned into a store error), what the transaction wrote is rolled back, and the turn is
    free."""
    store = SQLiteRunStore(sqlite_url)
    store.migrate()
    run = _claimed(store)
    boom = RuntimeError("boom")

    def delete_then_fail() -> None:
        with store._write() as (cur, _):
            cur.execute("DELETE FROM steptrail_runs WHERE run_id = ?", (run.id.hex,))
            raise boom

    with pytest.raises(RuntimeError) as raised:
        delete_then_fail()
    assert raised.value is boom
    assert store.row(run.id) is not None
    assert _turn_is_free(store)
    store.close()
