"""Retention: purge windows, complete removal (canary scan), tombstones, interrupted purges,
and the privacy filter seen from the tables themselves."""

from __future__ import annotations

import contextlib
import math
import sqlite3
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steptrail import App, RunContext
from steptrail.domain.enums import RunStatus, TerminationReason
from steptrail.domain.errors import UnknownRun
from steptrail.domain.retention import Category, RetentionPolicy
from steptrail.runtime import Runtime
from tests.conftest import make_runtime

AGED_COLUMNS = {
    "steptrail_events": ("originator_id", ["recorded_at"]),
    "steptrail_runs": ("run_id", ["created_at", "updated_at", "lease_expires_at", "available_at"]),
    "steptrail_view_run_summaries": ("run_id", ["created_at", "updated_at", "ended_at"]),
    "steptrail_view_dead_letters": ("run_id", ["dead_lettered_at"]),
}


def age(rt: Runtime, run_ids: list[UUID], days: float) -> None:
    """Move every instant of these runs (log, index, views) back by `days`, as if they had
    happened then; the log and every view stay consistent with each other."""
    store: Any = rt.store
    for table, (key, columns) in AGED_COLUMNS.items():
        sets = ", ".join(f"{c} = {c} - %(delta)s" for c in columns)
        if store.backend == "sqlite":
            sql = sets.replace("%(delta)s", ":delta")
            with store._write() as (cur, _):
                for run_id in run_ids:
                    cur.execute(
                        f"UPDATE {table} SET {sql} WHERE {key} = :id",
                        {"delta": int(days * 86_400_000_000), "id": run_id.hex},
                    )
        else:
            with store._connection() as conn:
                conn.execute(
                    f"UPDATE {table} SET {sets} WHERE {key} = ANY(%(ids)s)",
                    {"delta": timedelta(days=days), "ids": list(run_ids)},
                )


def all_table_text(rt: Runtime) -> str:
    """Every row of every table of the database, as text (what a canary scan reads)."""
    store: Any = rt.store
    chunks: list[str] = []
    if store.backend == "sqlite":
        with store._read() as cur:
            tables = [
                r[0]
                for r in cur.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                ).fetchall()
            ]
            for table in tables:
                for row in cur.execute(f'SELECT * FROM "{table}"').fetchall():
                    chunks.extend(
                        v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                        for v in tuple(row)
                    )
    else:
        with psycopg.connect(store.url) as conn:
            tables = [
                r[0]
                for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            ]
            for table in tables:
                for (text,) in conn.execute(
                    f"SELECT convert_from(convert_to(t::text, 'UTF8'), 'UTF8') FROM \"{table}\" t"
                ):
                    chunks.append(text)
                # bytea columns print as hex in t::text: decode them as well
                cols = [
                    r[0]
                    for r in conn.execute(
                        "SELECT column_name FROM information_schema.columns "
                        "WHERE table_name = %s AND data_type = 'bytea'",
                        (table,),
                    )
                ]
                for col in cols:
                    for (blob,) in conn.execute(f'SELECT "{col}" FROM "{table}"'):
                        chunks.append(bytes(blob).decode("utf-8", "replace"))
    return "\n".join(chunks)


def canary_app() -> App:
    """An agent that puts its request's `note` in every content-bearing field it can reach."""
    app = App()
    app.tool("send_email", effect="non_idempotent_write")

    @app.agent("canary")
    def agent(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        canary = request["note"]
        if ctx.resumed is None and request.get("wait"):
            ctx.llm("think", lambda: f"thought {canary}", payload={"messages": [canary]})
            ctx.request_approval(
                [{"name": "send_email", "arguments": {"body": canary}}], conversation=[canary]
            )
        ctx.tool("send_email", lambda: {"sent": canary}, arguments={"body": canary})
        return {"answer": canary}

    return app


def test_purge__canary_leaves_no_trace_in_any_table(db_url: str) -> None:
    """Runs carrying a canary in every content field, purged, leave it in no table at all,
    while runs inside the window keep theirs."""
    canary = f"CANARY-{uuid.uuid4().hex}"
    keeper = f"KEEPER-{uuid.uuid4().hex}"
    rt = make_runtime(db_url, app=canary_app(), privacy_level="full")
    try:
        old = [
            rt.enqueue("canary", {"note": canary}, idempotency_key=f"k-{canary}"),
            rt.enqueue("canary", {"note": canary, "wait": True}),
            rt.enqueue("canary", {"note": canary}),
        ]
        rt.work(burst=True)
        young = rt.enqueue("canary", {"note": keeper})
        rt.work(burst=True)
        rt.project()
        assert canary in all_table_text(rt)
        age(rt, old, days=40)
        report = rt.purge()
        assert report.total == 3
        text = all_table_text(rt)
        assert canary not in text
        assert keeper in text
        assert rt.get(young).status is RunStatus.COMPLETED
        for run_id in old:
            with pytest.raises(UnknownRun, match="purged"):
                rt.get(run_id)
        assert rt.verify() == []
    finally:
        rt.close()


def test_purge__windows_by_category(db_url: str) -> None:
    """Terminal runs follow agent_run, all others (queued, waiting) the approval window."""
    rt = make_runtime(db_url, retention_agent_run_days=10, retention_approval_days=60)
    try:
        done = rt.enqueue("scripted", {"steps": 1})
        rt.work(burst=True)
        waiting = rt.enqueue("scripted", {"approval": {"at": 1}})
        rt.work(burst=True)
        queued = rt.enqueue("scripted", {})
        age(rt, [done, waiting, queued], days=30)
        report = rt.purge()
        assert report.removed == {"agent_run": 1, "approval": 0}
        age(rt, [waiting, queued], days=40)
        report = rt.purge()
        assert report.removed == {"agent_run": 0, "approval": 2}
        assert rt.store.all_rows() == []
    finally:
        rt.close()


def test_purge__days_override_and_young_runs_untouched(runtime: Runtime) -> None:
    """--days N overrides every window; runs younger than it stay."""
    old = runtime.enqueue("scripted", {})
    young = runtime.enqueue("scripted", {})
    age(runtime, [old], days=3)
    assert runtime.purge(days=2).total == 1
    assert runtime.get(young).status is RunStatus.QUEUED
    with pytest.raises(ValueError, match="positive"):
        runtime.purge(days=0)


def test_purge__interrupted_then_rerun_finishes(runtime: Runtime) -> None:
    """A purge stopped after its first batch removed whole runs only; running it again
    finishes, and the views still equal a rebuild."""
    ids = [runtime.enqueue("scripted", {"steps": 1}) for _ in range(7)]
    runtime.work(burst=True)
    runtime.project()
    age(runtime, ids, days=40)
    store: Any = runtime.store
    first = store.purge_batch(
        category="agent_run",
        statuses=["completed", "failed", "cancelled"],
        cutoff=store.store_now() - timedelta(days=30),
        limit=3,
    )
    assert len(first) == 3
    assert runtime.verify() == []
    assert runtime.purge(batch=2).total == 4
    assert runtime.store.all_rows() == []
    assert runtime.views.status_counts() == {}
    assert runtime.verify() == []


def test_purge__zombie_append_to_a_purged_run_is_fenced(runtime: Runtime) -> None:
    """A worker still holding a purged run cannot write it back into existence."""
    from steptrail.domain.errors import VersionConflict

    run_id = runtime.enqueue("scripted", {})
    claimed = runtime.store.claim(holder="w", lease_ms=60_000, agents=["scripted"])
    assert claimed is not None
    age(runtime, [run_id], days=40)
    assert runtime.purge().removed["approval"] == 1
    claimed.run.record_step(kind="llm", name="late", duration_ms=1)
    with pytest.raises(VersionConflict):
        runtime.store.append(claimed.run)
    assert runtime.store.history(run_id) == []


def test_retention_policy__fallbacks() -> None:
    """Category windows fall back to the global one; overrides win; bad windows refused."""
    policy = RetentionPolicy(days=30, approval_days=90)
    assert policy.window(Category.AGENT_RUN) == 30
    assert policy.window(Category.APPROVAL) == 90
    assert policy.window(Category.APPROVAL, override=5) == 5
    with pytest.raises(ValueError, match="at least 1"):
        RetentionPolicy(days=0)


def planted(kind: str, token: str) -> tuple[str, str]:
    """A realistic secret of `kind` built around `token` (uppercase hex), and the part of it
    that must never reach a table."""
    alnum = token + token.lower()
    secrets = {
        "openai": f"sk-{alnum}",
        "aws": f"AKIA{token[:16]}",
        "github": f"ghp_{alnum[:36]}",
        "bearer": f"Authorization: Bearer {alnum}",
        "url": f"postgres://admin:{alnum}@db.internal/x",
        "email": f"{alnum.lower()}@example.org",
        "password": f"password={alnum}",
    }
    secret = secrets[kind]
    needle = token[:16] if kind == "aws" else (alnum.lower() if kind == "email" else alnum)
    return secret, needle


@settings(
    max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(["openai", "aws", "github", "bearer", "url", "email", "password"]),
    level=st.sampled_from(["metadata", "redacted"]),
)
def test_privacy__planted_secrets_reach_no_table(runtime: Runtime, kind: str, level: str) -> None:
    """Step content with planted secrets: at metadata no byte of this run's content reaches
    any table once it settles; at redacted no planted secret does."""
    secret, needle = planted(kind, uuid.uuid4().hex.upper()[:24])
    marker = uuid.uuid4().hex
    content = f"note {marker}: here it is {secret} (keep it safe)"
    app = App()
    name = f"leaky-{level}-{uuid.uuid4().hex[:8]}"

    @app.agent(name, privacy=level)
    def leaky(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("answer", lambda: content, payload={"messages": [content], "thinking": content})
        return {"answer": content}

    runtime.app.include(app)
    run_id = runtime.enqueue(name, {})
    runtime.work(burst=True)
    assert runtime.get(run_id).status is RunStatus.COMPLETED
    runtime.project()
    text = all_table_text(runtime)
    assert needle not in text
    if level == "metadata":
        assert marker not in text
    else:
        assert marker in text  # redacted keeps the rest of the content


def test_purge__never_removes_a_run_under_a_live_lease(runtime: Runtime) -> None:
    """An old run that a worker holds under a live lease is skipped and reported; old
    waiting, queued and dead-leased (worker gone) runs are purged as before."""
    from steptrail.domain.enums import WaitKind

    rt = runtime
    store: Any = rt.store

    def claimed(lease_ms: int) -> Any:
        rt.enqueue("scripted", {})
        got = store.claim(holder="worker:test:1:x", lease_ms=lease_ms, agents=["scripted"])
        assert got is not None
        return got.run

    live, dead, waiting = claimed(900_000), claimed(900_000), claimed(900_000)
    waiting.suspend(kind=WaitKind.APPROVAL, digest="sha256:x")
    store.append(waiting, resumable=b"{}")
    queued = rt.enqueue("scripted", {})
    age(rt, [live.id, dead.id, waiting.id, queued], 40)  # every lease is 40 days over too
    live.renew_lease()  # ... except this one: its worker is alive and renews
    store.append(live)

    report = rt.purge(days=30)

    assert report.skipped == {"approval": [live.id]}
    assert report.removed == {"agent_run": 0, "approval": 3}
    assert "Skipped 1 run(s) running under a live lease" in report.summary()
    assert report.as_dict()["skipped_live_lease"] == {"approval": [str(live.id)]}
    assert rt.get(live.id).status is RunStatus.RUNNING
    for gone in (dead.id, waiting.id, queued):
        with pytest.raises(UnknownRun):
            rt.get(gone)
    live.record_step(kind="llm", name="after-purge", duration_ms=1)
    store.append(live)  # the holder carries on, its history intact
    assert len(rt.history(live.id)) == 4


def journal_canary_app() -> App:
    """A run whose only verbatim content is a step result: a canary derived from the
    request (never equal to it), so before the purge it can only be in the journal."""
    app = App()

    @app.agent("journaled")
    def agent(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        pad = "." * request.get("pad", 0)  # a big result spills into overflow pages
        ctx.llm("make", lambda: f"CANARY-{request['seed'][::-1]}{pad}")
        ctx.request_approval([{"name": "send_email", "arguments": {}}])
        return {}

    return app


def test_purge__canary_in_a_journaled_result_leaves_zero_bytes(db_url: str) -> None:
    """A canary held only by the step journal of a waiting run is gone after the purge:
    from every table on both backends, and from the SQLite database and WAL files."""
    seed = uuid.uuid4().hex
    canary = f"CANARY-{seed[::-1]}"
    rt = make_runtime(db_url, app=journal_canary_app())  # privacy: metadata (the default)
    try:
        run_id = rt.enqueue("journaled", {"seed": seed})
        rt.work(burst=True)
        assert rt.get(run_id).status is RunStatus.WAITING_FOR_APPROVAL
        assert [e.value for e in rt.store.journal(run_id)] == [canary]
        rt.project()
        assert all_table_text(rt).count(canary) == 1  # the journal row, nowhere else
        if rt.store.backend == "sqlite":
            assert canary.encode() in sqlite_bytes(rt)  # the raw scan can see it
        age(rt, [run_id], days=40)
        assert rt.purge().total == 1
        assert canary not in all_table_text(rt)
        assert rt.store.journal(run_id) == []
        if rt.store.backend == "sqlite":
            assert canary.encode() not in sqlite_bytes(rt)
    finally:
        rt.close()


def test_purge__canary_in_the_journal_of_a_retried_then_failed_run_leaves_zero_bytes(
    db_url: str,
) -> None:
    """A failed run keeps its journal for a retry (ADR 0070): a canary returned by a step of
    a run that failed, was retried (replaying that step) and failed again is held by the
    journal alone, and the purge removes it: from every table on both backends, and from
    the SQLite database and WAL files, before and after a checkpoint."""
    seed = uuid.uuid4().hex
    canary = f"CANARY-{seed[::-1]}"
    app = App()
    made: list[str] = []

    @app.agent("retried")
    def agent(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("make", lambda: made.append("make") or f"CANARY-{request['seed'][::-1]}")
        ctx.step("step", "broken", lambda: {}["missing"])  # a bug: KeyError, every time
        return {}

    rt = make_runtime(db_url, app=app)  # privacy: metadata (the default)
    try:
        run_id = rt.enqueue("retried", {"seed": seed})
        rt.work(burst=True)
        rt.retry(run_id, by="ops")
        rt.work(burst=True)
        row = rt.get(run_id)
        assert (row.status, row.state.reason) == (RunStatus.FAILED, TerminationReason.NOT_RETRYABLE)
        assert made == ["make"]  # the retry replayed it
        assert [e.value for e in rt.store.journal(run_id) if not e.failed] == [canary]
        rt.project()
        assert all_table_text(rt).count(canary) == 1  # the journal entry, nowhere else
        if rt.store.backend == "sqlite":
            assert canary.encode() in sqlite_bytes(rt)  # the raw scan can see it
        age(rt, [run_id], days=40)
        assert rt.purge().total == 1
        assert canary not in all_table_text(rt)
        assert rt.store.journal(run_id) == []
        if rt.store.backend == "sqlite":
            assert canary.encode() not in sqlite_bytes(rt)
            store: Any = rt.store
            with sqlite3.connect(store.db_name) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert canary.encode() not in sqlite_bytes(rt)
    finally:
        rt.close()


def sqlite_bytes(rt: Runtime) -> bytes:
    """The raw bytes of the SQLite database file and its WAL, as a disk scan reads them."""
    store: Any = rt.store
    raw = b""
    for suffix in ("", "-wal"):
        path = Path(f"{store.db_name}{suffix}")
        if path.exists():
            raw += path.read_bytes()
    return raw


@pytest.mark.parametrize("pad", [0, 20_000], ids=["inline", "overflow"])
def test_settle__canary_in_a_journaled_result_leaves_zero_bytes(db_url: str, pad: int) -> None:
    """Settling drops the journal: after the approved run completes (replaying its step
    from the journal), its canary is in no table on either backend, and on SQLite, where
    the entry rode in its event's row (ADR 0050), not in the checkpointed file either, also
    when the result was big enough to spill into overflow pages (freed, and zeroed)."""
    seed = uuid.uuid4().hex
    canary = f"CANARY-{seed[::-1]}"
    rt = make_runtime(db_url, app=journal_canary_app())
    try:
        run_id = rt.enqueue("journaled", {"seed": seed, "pad": pad})
        rt.work(burst=True)
        assert [e.value for e in rt.store.journal(run_id)] == [canary + "." * pad]
        rt.approve(run_id, by="test", resume="queue")
        assert rt.work(burst=True).outcomes == {"completed": 1}
        assert rt.store.journal(run_id) == []
        assert canary not in all_table_text(rt)
        if rt.store.backend == "sqlite":
            store: Any = rt.store
            with sqlite3.connect(store.db_name) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert canary.encode() not in sqlite_bytes(rt)
    finally:
        rt.close()


class _VacuumSpy:
    """A store connection that notes the maintenance_work_mem each VACUUM ran with."""

    def __init__(self, conn: Any, vacuum: str, seen: list[int]) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_vacuum", vacuum)
        object.__setattr__(self, "_seen", seen)

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if query == self._vacuum:
            self._seen.append(_memory(self._conn))
        return self._conn.execute(query, params, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._conn, name, value)


def _memory(conn: Any) -> int:
    """maintenance_work_mem on `conn`, in kB."""
    row = conn.execute(
        "SELECT setting::bigint AS kb FROM pg_settings WHERE name = 'maintenance_work_mem'"
    ).fetchone()
    return int(row["kb"] if isinstance(row, dict) else row[0])


def test_purge_vacuum__given_the_memory_its_dead_rows_need_then_reset(pg_url: str) -> None:
    """The VACUUM after a purge runs with maintenance_work_mem sized to the rows the purge
    deleted and the dead rows the statistics know of (ADR 0065): PostgreSQL allocates all of
    it up front, which at a million runs cost more than the VACUUM's work. The setting is
    reset afterwards on that connection, and the count starts again from zero."""
    rt = make_runtime(pg_url)
    try:
        store: Any = rt.store
        old = [rt.enqueue("scripted", {"steps": 2}) for _ in range(4)]
        rt.work(burst=True)
        age(rt, old, days=40)
        seen: list[int] = []
        after: list[int] = []
        connection = store._connection

        @contextlib.contextmanager
        def spied() -> Any:
            with connection() as conn:
                yield _VacuumSpy(conn, store.q["after_purge"], seen)
                after.append(_memory(conn))

        store._connection = spied
        try:
            assert rt.purge(batch=2).total == 4
        finally:
            del store._connection
        assert seen == [1024]  # a few dozen dead rows: PostgreSQL's minimum
        with psycopg.connect(pg_url, autocommit=True) as conn:
            default = _memory(conn)
        assert after[-1] == default
        assert store._purged_rows == 0

        def kb(dead: int) -> int:
            with connection() as conn:
                return int(conn.execute(store.q["vacuum_memory"], {"dead": dead}).fetchone()["kb"])

        assert kb(0) == 1024
        # 6 bytes a row, a quarter more, and 64 kB (n_dead_tup may add a few rows here)
        assert (
            min(default, math.ceil(1e6 * 7.5 / 1024) + 64) <= kb(1_000_000) <= min(default, 7_400)
        )
        assert kb(10**10) == default  # never more than the session's own setting
    finally:
        rt.close()
