"""A claimed run's journal comes with its claim on PostgreSQL (ADR 0086): the same entries
the segment would read, read after the claim's locks; SQLite segments read their own."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import psycopg
import pytest

from steptrail import App, RunContext
from steptrail.domain.enums import RunStatus
from steptrail.runtime import Runtime
from tests.conftest import make_runtime

HOLDER = "worker:test-claimed-journal"

app = App()


@app.agent("napper")
def napper(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    first = ctx.llm("first", lambda: {"text": "é" * 3, "n": [1, 2]})
    # Caught: replayed, the failure is a ReplayedError, which `Exception` catches too.
    with contextlib.suppress(Exception):
        ctx.step("think", "fails", _fail)
    ctx.sleep(request.get("seconds", 0.2))
    return {"first": first, "after": ctx.llm("after", lambda: "done")}


def _fail() -> None:
    raise ValueError("a recorded failure replays as one")


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    runtime = make_runtime(db_url, app)
    yield runtime
    runtime.close()


def asleep(rt: Runtime, seconds: float = 0.2) -> UUID:
    run_id = rt.enqueue("napper", {"seconds": seconds})
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.WAITING_FOR_TIMER
    return run_id


def claim(rt: Runtime) -> list[Any]:
    return rt.store.claim_batch(holder=HOLDER, lease_ms=60_000, agents=["napper"], limit=8)


def test_claim__brings_the_journal_the_segment_would_read(rt: Runtime) -> None:
    """On PostgreSQL the claimed run's journal is the store's journal, entry for entry
    (a value, a recorded failure, the wait's start); a fresh run's is empty. SQLite leaves
    it to the segment (None)."""
    sleeping = asleep(rt)
    fresh = rt.enqueue("napper", {})
    time.sleep(0.25)
    got = {c.run.id: c.journal for c in claim(rt)}
    assert set(got) == {sleeping, fresh}
    if rt.store.backend == "sqlite":
        assert got == {sleeping: None, fresh: None}
        return
    assert got[fresh] == ()
    assert got[sleeping] == tuple(rt.store.journal(sleeping))
    assert [(e.seq, e.kind, e.name) for e in got[sleeping] or ()] == [
        (1, "llm", "first"),
        (2, "think", "fails"),
    ]


def test_worker__a_woken_segment_reads_no_journal_of_its_own(rt: Runtime) -> None:
    """The woken segment replays from the journal its claim brought (PostgreSQL: no
    journal read; SQLite: one) and ends the run as it would have."""
    run_id = asleep(rt)
    store: Any = rt.store
    reads: list[UUID] = []
    real = store.journal

    def counting(run: UUID) -> Any:
        reads.append(run)
        return real(run)

    store.journal = counting
    try:
        time.sleep(0.25)
        rt.work(burst=True)
    finally:
        del store.journal
    row = rt.get(run_id)
    assert row.status is RunStatus.COMPLETED
    assert reads == ([] if rt.store.backend == "postgres" else [run_id])


def test_claimed_journal__reads_after_the_claims_locks(pg_url: str) -> None:
    """The function's snapshot is taken when it runs, not when the calling query began: a
    journal row committed while the query was already running (here: blocked on a lock, as
    a claim is between its start and its row locks) is seen. A plain subquery of the same
    query does not see it: the reason the claim reads through the function."""
    runtime = make_runtime(pg_url, app)
    try:
        run_id = asleep(runtime)
    finally:
        runtime.close()
    key = 86_0086

    def late_row(ready: threading.Event) -> None:
        with psycopg.connect(pg_url) as other:
            other.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
            ready.set()
            time.sleep(0.3)  # the other query has begun and waits for the lock
            other.execute(
                "INSERT INTO steptrail_journal (run_id, seq, position, kind, name, fingerprint,"
                " outcome) VALUES (%s, 99, 99, 'llm', 'late', 'f', '{}'::bytea)",
                (run_id,),
            )
            other.commit()

    def query(sql: str) -> list[int]:
        ready = threading.Event()
        writer = threading.Thread(target=late_row, args=(ready,))
        writer.start()
        assert ready.wait(10)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            (row,) = conn.execute(sql, {"key": key, "run_id": run_id}).fetchall()
            conn.execute("DELETE FROM steptrail_journal WHERE seq = 99")
        writer.join()
        return list(row[0])

    through_function = query(
        "SELECT j.j_seq FROM (SELECT pg_advisory_lock(%(key)s)::text AS got) AS s"
        " CROSS JOIN LATERAL steptrail_claimed_journal("
        "   CASE WHEN s.got IS NOT NULL THEN %(run_id)s::uuid END, 2) AS j"
    )
    plain = query(
        "SELECT (SELECT array_agg(seq ORDER BY seq) FROM steptrail_journal"
        "        WHERE run_id = %(run_id)s::uuid AND s.got IS NOT NULL)"
        " FROM (SELECT pg_advisory_lock(%(key)s)::text AS got) AS s"
    )
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_unlock_all()")
    assert through_function == [1, 2, 99]
    assert plain == [1, 2]
