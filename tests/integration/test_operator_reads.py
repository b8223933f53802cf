"""Operator reads cost what they return (ADR 0042): `stats` reads kept counts, `runs` pages
along an index, `show`/`audit` page long trails. Here: that what they return is right, on
both backends, and (SQLite, where the plan can be read without statistics) which index the
statements walk."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.rows import dict_row
from typer.testing import CliRunner

from steptrail.cli import cli
from steptrail.domain.enums import RunStatus
from steptrail.domain.run import Run
from steptrail.infrastructure.sqlfiles import queries
from steptrail.runtime import Runtime
from tests.conftest import make_runtime
from tests.integration.test_planner_proof import (  # noqa: F401 - pg_fresh is a fixture
    _buffers,
    _nodes,
    _plans,
    _read,
    _scans_of_runs,
    pg_fresh,
)
from tests.integration.test_upgrade import catch_up, upgraded  # noqa: F401 - a fixture


def mixed_history(rt: Runtime) -> dict[str, list[UUID]]:
    """Runs that complete, dead-letter (two reasons' worth), get cancelled, wait, stay
    queued."""
    made: dict[str, list[UUID]] = {
        "completed": [rt.enqueue("scripted", {"steps": 1}) for _ in range(4)],
        "failed": [
            rt.enqueue("scripted", {"steps": 1, "fail": {"class": "auth", "at": 1}})
            for _ in range(3)
        ],
        "waiting": [rt.enqueue("scripted", {"steps": 2, "approval": {"at": 2}})],
    }
    made["cancelled"] = [rt.enqueue("scripted", {}) for _ in range(2)]
    for run_id in made["cancelled"]:
        rt.cancel(run_id)
    rt.work(concurrency=2, burst=True)
    made["queued"] = [rt.enqueue("scripted", {"steps": 1}) for _ in range(2)]
    rt.project()
    return made


def recount(rt: Runtime) -> dict[tuple[str, str], int]:
    """Ended runs by reason, counted the slow way: over every summary."""
    return dict(
        Counter(
            (s.state.status.value, s.state.reason.value)
            for s in rt.views.summaries()
            if s.state.reason is not None
        )
    )


# -- reason counts ---------------------------------------------------------------------------


def test_reason_counts__kept_through_endings_retries_and_purges(runtime: Runtime) -> None:
    made = mixed_history(runtime)
    counts = runtime.views.reason_counts()
    assert counts == recount(runtime)
    assert counts[("failed", "not_retryable")] == 3
    assert counts[("completed", "completed")] == 4
    assert counts[("cancelled", "cancelled")] == 2
    # A retried run leaves its failed reason: the count follows the summary's update.
    runtime.retry(made["failed"][0], by="ops")
    runtime.project()
    assert runtime.views.reason_counts() == recount(runtime)
    assert runtime.views.reason_counts()[("failed", "not_retryable")] == 2
    # A rebuild empties the summaries and folds them again: the counts follow both.
    runtime.rebuild("reporting")
    assert runtime.views.reason_counts() == recount(runtime)
    assert runtime.verify("reporting") == []


def test_reason_counts__follow_a_purge(db_url: str) -> None:
    rt = make_runtime(db_url, retention_days=1)
    try:
        mixed_history(rt)
        before = rt.views.reason_counts()
        assert before == recount(rt)
        _age_every_run(rt, days=3)
        rt.purge()
        assert rt.views.reason_counts() == recount(rt)
        assert sum(rt.views.reason_counts().values()) < sum(before.values())
    finally:
        rt.close()


@pytest.mark.parametrize("upgraded", [9], indirect=True, ids=lambda v: f"schema{v}")
def test_reason_counts__filled_by_the_migration(upgraded: Runtime) -> None:  # noqa: F811
    """A database from before migration 0016 gets its counts from the summaries it holds,
    and they stay exact as the views catch up and new runs end."""
    rt = upgraded
    before = rt.views.reason_counts()
    assert before
    assert before == recount(rt)
    catch_up(rt)
    rt.enqueue("scripted", {"steps": 1})
    rt.work(burst=True)
    rt.project()
    assert rt.views.reason_counts() == recount(rt)
    assert rt.verify() == []


def summary_indexes(rt: Runtime) -> set[str]:
    url = rt.settings.database_url
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            return {
                r[0]
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'index'"
                    " AND tbl_name = 'steptrail_view_run_summaries'"
                )
            }
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'steptrail_view_run_summaries'"
        ).fetchall()
    return {r[0] for r in rows}


@pytest.mark.parametrize("upgraded", [9], indirect=True, ids=lambda v: f"schema{v}")
def test_summaries__the_status_reason_index_is_gone_and_reasons_still_verify(
    upgraded: Runtime,  # noqa: F811
) -> None:
    """Migration 0021 (ADR 0052) drops the summaries' (status, reason) index from a database
    that has one: its entries of a status are in run id order, so every summary the
    projector wrote or a purge deleted dirtied a leaf page of its own. Nothing read it but
    verify's recount of the reasons, which still agrees with the counts after a purge."""
    rt = upgraded
    indexes = summary_indexes(rt)
    assert "steptrail_view_run_summaries_status_idx" not in indexes
    assert "steptrail_view_run_summaries_status_created_idx" in indexes  # the rest stay
    catch_up(rt)
    mixed_history(rt)
    rt.project()
    assert rt.views.reason_counts() == recount(rt)
    _age_every_run(rt, days=400)
    assert rt.purge(days=365, batch=3).total > 0
    rt.project()
    assert rt.views.reason_counts() == recount(rt)
    assert rt.verify() == []


def _age_every_run(rt: Runtime, *, days: int) -> None:
    """Move every run's creation `days` into the past (raw SQL: only a test does this)."""
    url = rt.settings.database_url
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        conn.execute(f"UPDATE steptrail_runs SET created_at = created_at - {days} * 86400000000")
        conn.commit()
        conn.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE steptrail_runs SET created_at = created_at - make_interval(days => %s)",
            (days,),
        )


def test_reason_counts__a_purge_racing_the_projector_keeps_them_exact(db_url: str) -> None:
    """Purge deletes summaries while the projector writes them: both hold the reporting
    tracking row, so the triggers' counter rows see one writer at a time and end equal to
    a recount."""
    rt = make_runtime(db_url, retention_days=1)
    try:
        mixed_history(rt)
        _age_every_run(rt, days=3)
        for _ in range(6):
            rt.enqueue("scripted", {"steps": 1})
        errors: list[BaseException] = []

        def project() -> None:
            try:
                for _ in range(20):
                    rt.project()
            except BaseException as error:
                errors.append(error)

        projector = threading.Thread(target=project)
        projector.start()
        rt.work(concurrency=2, burst=True)
        rt.purge(batch=1)
        projector.join(timeout=60)
        assert not errors
        rt.project()
        assert rt.views.reason_counts() == recount(rt)
    finally:
        rt.close()


# -- runs: keyset pages ----------------------------------------------------------------------


@pytest.mark.parametrize("status", [None, "failed", "completed", "queued", "running"])
def test_runs__pages_walk_every_run_once_newest_first(runtime: Runtime, status: Any) -> None:
    mixed_history(runtime)
    everything = runtime.runs(status=status, limit=1000)
    expected = [r.run_id for r in everything]
    keys = [(r.created_at, r.run_id) for r in everything]
    assert keys == sorted(keys, reverse=True)
    if status is not None:
        assert {r.state.status.value for r in everything} <= {status}
    paged: list[UUID] = []
    before = None
    while True:
        page = runtime.runs(status=status, limit=2, before=before)
        if not page:
            break
        paged.extend(r.run_id for r in page)
        before = page[-1].run_id
    assert paged == expected


def test_runs__one_agents_runs_page_along_its_index_every_run_once(runtime: Runtime) -> None:
    """Without a status, an agent's runs (ADR 0056) come newest first, only that agent's,
    every one once across `before` pages, with a status or a reason as before."""
    mixed_history(runtime)
    rare: list[UUID] = []
    for i in range(5):
        run = Run.enqueue(run_id=uuid4(), agent="rare", request_digest="d", actor="test")
        rare.append(runtime.store.create(run, request=b"{}").id)
        if i % 2:
            runtime.enqueue("scripted", {"steps": 1})
    everything = runtime.runs(agent="rare", limit=1000)
    assert [r.run_id for r in everything] == rare[::-1]
    paged: list[UUID] = []
    before = None
    while page := runtime.runs(agent="rare", limit=2, before=before):
        assert len(page) <= 2
        paged.extend(r.run_id for r in page)
        before = page[-1].run_id
    assert paged == rare[::-1]
    scripted = runtime.runs(agent="scripted", limit=1000)
    assert {r.state.agent for r in scripted} == {"scripted"}
    assert len(scripted) == len(runtime.runs(limit=1000)) - len(rare)
    assert runtime.runs(agent="rare", status="queued", limit=1000) == everything
    paged = []
    before = None
    while page := runtime.runs(agent="rare", status="queued", limit=2, before=before):
        assert len(page) <= 2
        paged.extend(r.run_id for r in page)
        before = page[-1].run_id
    assert paged == rare[::-1]
    assert runtime.runs(agent="scripted", status="queued", limit=1000) == [
        r for r in scripted if r.status is RunStatus.QUEUED
    ]
    assert runtime.runs(agent="rare", status="completed", limit=1000) == []
    assert runtime.runs(agent="rare", reason="completed", limit=1000) == []
    assert runtime.runs(agent="nobody") == []


def test_runs__running_runs_are_listed(runtime: Runtime) -> None:
    """Running runs are not in the partial status index; they are listed along the lease
    index."""
    run_id = runtime.enqueue("scripted", {"steps": 1})
    claimed = runtime.store.claim(holder="test", lease_ms=60_000, agents=["scripted"])
    assert claimed is not None
    (row,) = runtime.runs(status=RunStatus.RUNNING)
    assert row.run_id == run_id
    assert runtime.runs(status="queued") == []


def test_sqlite_plans__each_read_walks_its_index(sqlite_url: str) -> None:
    """Without statistics (SQLite keeps none unless ANALYZE runs) the listing by status
    walks the partial status index in order (no sort), the oldest-queued figure reads the
    queued-since index, and reason counts read the counter table."""
    make_runtime(sqlite_url).close()
    q = queries("sqlite")
    conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    try:
        params = {
            "status": "failed",
            "agent": None,
            "reason": None,
            "limit": 50,
            "before_at": 2**62,
            "before_id": "g",
        }
        plan = " | ".join(
            r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + q["select_runs_status"], params)
        )
        assert "steptrail_runs_status_created_idx" in plan
        assert "TEMP B-TREE" not in plan
        plan = " | ".join(
            r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + q["select_runs"], params)
        )
        assert "steptrail_runs_created_idx" in plan
        assert "TEMP B-TREE" not in plan
        plan = " | ".join(
            r[3]
            for r in conn.execute(
                "EXPLAIN QUERY PLAN " + q["select_runs_agent"], {**params, "agent": "a"}
            )
        )
        assert "steptrail_runs_agent_created_idx (agent=? AND" in plan
        assert "TEMP B-TREE" not in plan
        plan = " | ".join(
            r[3]
            for r in conn.execute(
                "EXPLAIN QUERY PLAN " + q["select_runs_agent_status"], {**params, "agent": "a"}
            )
        )
        assert "steptrail_runs_status_idx (status=? AND agent=? AND" in plan
        assert "TEMP B-TREE" not in plan
        plan = " | ".join(
            r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + q["queue_health"], {"now": 0})
        )
        assert "steptrail_runs_queued_since_idx" in plan
        plan = " | ".join(
            r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + q["select_reason_counts"])
        )
        assert "steptrail_view_reason_counts" in plan
        assert "steptrail_view_run_summaries" not in plan
    finally:
        conn.close()


def test_oldest_queued__is_the_oldest_queued_run(runtime: Runtime) -> None:
    assert runtime.views.health().oldest_queued_at is None
    first = runtime.enqueue("scripted", {"steps": 1})
    runtime.enqueue("scripted", {"steps": 1})
    assert runtime.views.health().oldest_queued_at == runtime.get(first).updated_at


# -- show and audit: paged trails ------------------------------------------------------------


def cli_json(url: str, *args: str) -> Any:
    result = CliRunner().invoke(cli, ["--database-url", url, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def cli_text(url: str, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, ["--database-url", url, *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


@pytest.fixture
def long_run(runtime: Runtime) -> UUID:
    run_id = runtime.enqueue("scripted", {"steps": 150})
    runtime.work(burst=True)
    assert runtime.get(run_id).state.version > 150
    return run_id


def versions(text: str) -> list[int]:
    """The versions in the first column of a drawn trail."""
    found = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 2 and cells[1].isdigit():
            found.append(int(cells[1]))
    return found


def test_show__draws_the_newest_page_and_says_how_to_see_more(
    runtime: Runtime, long_run: UUID
) -> None:
    url = runtime.settings.database_url
    last = runtime.get(long_run).state.version
    text = cli_text(url, "show", str(long_run))
    assert versions(text) == list(range(last - 99, last + 1))
    assert f"versions {last - 99}-{last} of {last} shown" in text
    assert "--from N --limit K" in text
    assert "--all for every one" in text
    text = cli_text(url, "show", str(long_run), "--from", "3", "--limit", "5")
    assert versions(text) == [3, 4, 5, 6, 7]
    text = cli_text(url, "show", str(long_run), "--all")
    assert versions(text) == list(range(1, last + 1))
    assert "shown;" not in text
    text = cli_text(url, "show", str(long_run), "--from", str(last + 5))
    assert f"no events from version {last + 5}" in text
    assert "--all shows every event" in cli_text(
        url, "show", str(long_run), "--all", "--from", "2", code=2
    )


def test_show_json__complete_unless_a_page_is_asked_for(runtime: Runtime, long_run: UUID) -> None:
    url = runtime.settings.database_url
    last = runtime.get(long_run).state.version
    whole = cli_json(url, "show", str(long_run), "--json")
    assert [e["version"] for e in whole["events"]] == list(range(1, last + 1))
    assert "page" not in whole
    page = cli_json(url, "show", str(long_run), "--json", "--from", "10", "--limit", "4")
    assert [e["version"] for e in page["events"]] == [10, 11, 12, 13]
    assert page["page"] == {"from": 10, "to": 13, "of": last}
    assert page["events"] == whole["events"][9:13]
    tail = cli_json(url, "show", str(long_run), "--json", "--limit", "3")
    assert [e["version"] for e in tail["events"]] == [last - 2, last - 1, last]


def test_audit__pages_the_events_up_to_the_version(runtime: Runtime, long_run: UUID) -> None:
    url = runtime.settings.database_url
    text = cli_text(url, "audit", str(long_run), "--at", "120")
    assert versions(text)[-100:] == list(range(21, 121))
    assert "versions 21-120 of 120 shown" in text
    whole = cli_json(url, "audit", str(long_run), "--at", "120", "--json")
    assert [e["version"] for e in whole["events"]] == list(range(1, 121))
    assert whole["state"]["version"] == 120
    page = cli_json(url, "audit", str(long_run), "--at", "120", "--json", "--from", "119")
    assert [e["version"] for e in page["events"]] == [119, 120]
    assert page["page"] == {"from": 119, "to": 120, "of": 120}
    assert page["state"] == whole["state"]


def test_history__a_page_reads_that_range(runtime: Runtime, long_run: UUID) -> None:
    whole = runtime.history(long_run)
    assert runtime.history(long_run, first=7, limit=3) == whole[6:9]
    assert runtime.history(long_run, first=len(whole) + 1, limit=3) == []
    assert runtime.history(long_run, first=len(whole) - 1) == whole[-2:]


def test_reason_counts__a_bulk_delete_updates_each_count_once(pg_url: str) -> None:
    """Deleting many summaries in one statement (a rebuild's clear, a purge batch) updates
    each (status, reason) count row once, not once per summary: every update of one row in
    one transaction leaves a version the next must walk past, which made a million-run
    `rebuild reporting` quadratic (ADR 0059). Counted by the server for this transaction."""
    rt = make_runtime(pg_url)
    try:
        mixed_history(rt)
        expected = recount(rt)
        assert sum(expected.values()) > len(expected)  # several summaries per count row
    finally:
        rt.close()
    with psycopg.connect(pg_url) as conn:
        conn.execute("DELETE FROM steptrail_view_run_summaries")
        row = conn.execute(
            "SELECT n_tup_upd FROM pg_stat_xact_user_tables"
            " WHERE relname = 'steptrail_view_reason_counts'"
        ).fetchone()
        assert row is not None
        assert row[0] == len(expected)
        left = conn.execute("SELECT sum(count) FROM steptrail_view_reason_counts").fetchone()
        assert left == (0,)
        conn.rollback()


# -- runs of one agent on PostgreSQL: the plan ------------------------------------------------

RARE_FILL = """
INSERT INTO steptrail_runs (
    run_id, agent, status, version, requeue_count, reason, doc, created_at, updated_at
)
SELECT gen_random_uuid(), %(agent)s, 'completed', 3, 0, 'completed', '{}'::jsonb,
       now() - %(age_s)s * interval '1 second' + g * interval '1 ms', now()
FROM generate_series(1, %(n)s) AS g
"""
HISTORY_RUNS = 20_000


@pytest.mark.parametrize("analysed", [False, True], ids=["never-analysed", "analysed"])
@pytest.mark.parametrize(
    ("query", "index"),
    [
        ("select_runs_agent", "steptrail_runs_agent_created_idx"),
        ("select_runs_agent_status", "steptrail_runs_status_idx"),
    ],
    ids=["agent", "agent-and-status"],
)
def test_pg_plan__a_rare_agents_page_walks_its_index_not_the_history(
    pg_fresh: str,  # noqa: F811
    analysed: bool,
    query: str,
    index: str,
) -> None:
    """Three runs of a rare agent, older than a history of 20,000 completed runs of another:
    a page of the rare agent's runs (ADR 0056), or of its completed runs (ADR 0064), walks
    its index backwards and reads the rows it returns, with no sort, whether or not the
    planner has statistics; so does the next page, below the key of the last row."""
    q = queries("postgres")[query]
    with psycopg.connect(pg_fresh, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(RARE_FILL, {"agent": "rare", "n": 3, "age_s": 2 * 86_400})
        conn.execute(RARE_FILL, {"agent": "common", "n": HISTORY_RUNS, "age_s": 86_400})
        if analysed:
            conn.execute("ANALYZE steptrail_runs")
        params: dict[str, Any] = {
            "agent": "rare",
            "status": "completed",
            "reason": None,
            "limit": 2,
            "before_at": datetime(9999, 12, 31, tzinfo=UTC),
            "before_id": UUID(int=(1 << 128) - 1),
        }
        got: dict[str, Any] = {}

        def page() -> None:
            got["rows"] = conn.execute(q, params).fetchall()

        for expected in (2, 1):  # the first page, then the one below its last row
            plans = _plans(conn, page)
            (plan,) = [p["Plan"] for p in plans]
            assert len(got["rows"]) == expected
            scans = _scans_of_runs(plan)
            assert [n.get("Index Name") for n in scans] == [index]
            assert sum(_read(n) for n in scans) == expected
            assert not [n for n in _nodes(plan) if "Sort" in n["Node Type"]]
            assert sum(_buffers(n) for n in scans) < 20  # a few index and heap pages
            last = got["rows"][-1]
            params.update(before_at=last["created_at"], before_id=last["run_id"])
