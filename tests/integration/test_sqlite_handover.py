"""SQLite's cross-process write handover is bounded: a stopped process holding the write
turn makes other writers fail as on a store error (and so fence themselves), not freeze.
SQLite only: PostgreSQL has no such handover."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from steptrail.domain.errors import StoreUnavailable
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
