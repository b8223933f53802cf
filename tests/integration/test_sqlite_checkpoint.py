"""SQLite's WAL is checkpointed by a thread of the store's own, outside the write turn
(ADR 0061): writers only wake it, a reader in the way or another process checkpointing
costs nothing but a later checkpoint, and whatever the interleaving nothing written is lost.
SQLite only: PostgreSQL checkpoints in its own server processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from steptrail.domain.run import Run
from steptrail.infrastructure import sqlite as sqlite_store
from steptrail.infrastructure.sqlite import WRITER_AUTOCHECKPOINT, SQLiteRunStore

THREAD_NAME = "steptrail-sqlite-checkpoint"


def _store(tmp_path: Path, name: str = "steptrail.db") -> tuple[SQLiteRunStore, Path]:
    path = tmp_path / name
    store = SQLiteRunStore(f"sqlite:///{path}")
    store.migrate()
    return store, path


def _claimed_run(store: SQLiteRunStore, holder: str = "w") -> Run:
    run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
    store.create(run, request=b"{}")
    run.claim(holder=holder, lease_ms=60_000)
    store.append(run)
    return run


def _steps(store: SQLiteRunStore, run: Run, n: int) -> None:
    for i in range(n):
        run.record_step(kind="llm", name=f"s{i}", duration_ms=0, payload={"i": i}, tokens=1)
        store.append(run)


def _wait_for(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def test_checkpoint__the_writers_commits_wake_the_stores_own_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every CHECKPOINT_EVERY commits the writer wakes the thread, which copies the WAL into
    the database file; the writer connection itself waits for WRITER_AUTOCHECKPOINT frames
    before it would checkpoint inside a commit. Without the thread nothing in this test
    would reach the database file (it stays at its size after the migration)."""
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_EVERY", 10)
    store, path = _store(tmp_path)
    try:
        run = _claimed_run(store)
        assert store._writer is not None
        writer = store._writer.connection
        assert writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WRITER_AUTOCHECKPOINT
        assert store._checkpointer.done == 0
        size_before = path.stat().st_size
        _steps(store, run, 38)  # 40 commits since the store opened, with the claim and create
        _wait_for(lambda: store._checkpointer.done >= 1)
        assert len(_checkpoint_threads()) >= 1
        _wait_for(lambda: path.stat().st_size > size_before)
        assert store.load(run.id).version == run.version
    finally:
        store.close()


def test_checkpoint__closing_the_store_stops_its_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_EVERY", 1)
    store, _ = _store(tmp_path)
    run = _claimed_run(store)
    _steps(store, run, 3)
    thread = store._checkpointer._thread
    assert thread is not None
    assert thread.is_alive()
    store.close()
    assert not thread.is_alive()
    store._checkpointer.wake()  # a late wake-up of a closed store starts nothing
    assert store._checkpointer._thread is thread


def test_checkpoint__a_thread_that_is_gone_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a fork the child has no checkpoint thread (nor does a process whose thread
    died): the next wake-up starts one."""
    store, _ = _store(tmp_path)  # the default threshold: no thread yet
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_EVERY", 1)
    try:
        assert store._checkpointer._thread is None
        gone = threading.Thread(target=lambda: None)
        gone.start()
        gone.join()
        store._checkpointer._thread = gone
        run = _claimed_run(store)
        _steps(store, run, 2)
        thread = store._checkpointer._thread
        assert thread is not gone
        assert thread is not None
        assert thread.is_alive()
        _wait_for(lambda: store._checkpointer.done >= 1)
    finally:
        store.close()


WRITER = """
import sys, uuid
from steptrail.domain.run import Run
from steptrail.infrastructure import sqlite as sqlite_store
sqlite_store.CHECKPOINT_EVERY = 1  # a checkpoint after every commit
store = sqlite_store.SQLiteRunStore(sys.argv[1])
ids = []
for r in range(3):
    run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
    store.create(run, request=b"{}")
    run.claim(holder="w", lease_ms=60_000)
    store.append(run)
    for i in range(int(sys.argv[2])):
        run.record_step(kind="llm", name=f"s{i}", duration_ms=0, payload={"i": i}, tokens=1)
        store.append(run)
    ids.append(f"{run.id} {run.version}")
store.close()
print("\\n".join(ids), flush=True)
"""


def test_checkpoint__processes_threads_and_a_pinning_reader_lose_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes and two threads append, each with a checkpoint after every commit
    (their checkpoints collide: only one runs at a time, the others find it busy), while a
    reader holds a read transaction open across many of their commits (a checkpoint cannot
    pass the frames it still reads). Every event written is in the log afterwards, the file
    passes SQLite's integrity check, and once the reader is gone the WAL is folded in."""
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_EVERY", 1)
    store, path = _store(tmp_path)
    url = f"sqlite:///{path}"
    steps = 60
    try:
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        pinned = reader.execute("SELECT count(*) FROM steptrail_events").fetchone()[0]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, url, str(steps)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        runs = [_claimed_run(store, holder=f"t{k}") for k in range(2)]
        errors: list[BaseException] = []

        def write(run: Run) -> None:
            try:
                _steps(store, run, steps)
            except BaseException as error:  # reported below
                errors.append(error)

        threads = [threading.Thread(target=write, args=(run,)) for run in runs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        outputs = [proc.communicate(timeout=120) for proc in procs]
        assert errors == []
        assert [proc.returncode for proc in procs] == [0, 0], [err for _, err in outputs]
        # The reader still sees its snapshot: the checkpoints left its frames alone.
        assert reader.execute("SELECT count(*) FROM steptrail_events").fetchone()[0] == pinned
        reader.execute("COMMIT")
        reader.close()
        expected = {run.id: run.version for run in runs}
        for out, _ in outputs:
            pairs = out.split()
            for run_id, version in zip(pairs[::2], pairs[1::2], strict=True):
                expected[uuid.UUID(run_id)] = int(version)
        assert len(expected) == 8
        for run_id, version in expected.items():
            history = store.history(run_id)
            assert [e.version for e in history] == list(range(1, version + 1))
        # The WAL folds in completely now that no reader holds it (a check that meets the
        # store's own checkpoint in progress finds it busy, and looks again).
        _steps(store, runs[0], 1)
        with sqlite3.connect(path) as check:

            def folded() -> bool:
                busy, log, done = check.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                return bool(busy == 0 and log == done)

            _wait_for(folded)
            assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        store.close()
