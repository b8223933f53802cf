"""Upgrades: a database built by the code of every earlier schema version, with runs in every
state, opens with the current code (which migrates it to the head, whatever migrations were
added since) and works: views, run index and `verify` clean, every run loadable, a queued
run completes, a waiting run resumes after its decision (ADR 0017).

The fixtures were made by tests/fixtures/upgrade/build.py and are committed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

from steptrail import App, RunContext
from steptrail.domain.enums import RetryMode, RunStatus
from steptrail.domain.errors import IllegalTransition
from steptrail.domain.retry_plan import RetryPlan
from steptrail.events import Completed
from steptrail.render import family_lines
from steptrail.runtime import Runtime
from steptrail.testing import pgclock
from tests.conftest import PG_ADMIN_URL, make_runtime
from tests.fixtures.upgrade.populate import YEAR, app
from tests.integration.test_concurrency_keys import key_table

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade"
VERSIONS = sorted(int(p.stem[1:]) for p in FIXTURES.glob("v*.db"))
# The queues of the runs every fixture has; from schema 34 on, each feature's runs are on a
# queue of their own (family, keyed, rated: see populate.py), which the checks of the
# older features leave alone.
BASE_QUEUES = ["default", "bulk"]


def test_fixtures__one_per_backend_for_every_version() -> None:
    """Every fixture version exists for both backends, from schema 1 on."""
    sql = sorted(int(p.stem[1:]) for p in FIXTURES.glob("v*.sql"))
    assert sql == VERSIONS
    assert VERSIONS[:4] == [1, 2, 3, 4]


@pytest.fixture
def upgraded(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[Runtime]:
    version: int = request.param
    if backend == "sqlite":
        path = tmp_path / "old.db"
        shutil.copyfile(FIXTURES / f"v{version}.db", path)
        rt = make_runtime(f"sqlite:///{path}", app=app)
        try:
            yield rt
        finally:
            rt.close()
        return
    name = f"steptrail_upgrade_v{version}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    url = f"{base}/{name}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        subprocess.run(
            [
                "psql",
                "-q",
                "-X",
                "-v",
                "ON_ERROR_STOP=1",
                "-f",
                str(FIXTURES / f"v{version}.sql"),
                url,
            ],
            check=True,
            capture_output=True,
        )
        rt = make_runtime(url, app=app)
        try:
            yield rt
        finally:
            rt.close()
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def catch_up(rt: Runtime) -> None:
    """Fold the views until every run's summary is at its index version (bounded: a wedged
    runner fails the test). On PostgreSQL the runner reads only transactions older than
    every one still running in the cluster, so a busy server may need a few passes."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rt.project()
        index = {r.run_id: r.state.version for r in rt.store.all_rows()}
        views = {s.state.run_id: s.state.version for s in rt.views.summaries()}
        if views == index:
            return
        time.sleep(0.1)
    pytest.fail("the views never caught up with the log")


@pytest.mark.parametrize("upgraded", VERSIONS, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__old_database_opens_migrated_and_works(
    upgraded: Runtime, request: pytest.FixtureRequest
) -> None:
    """An old database is migrated to the head and everything in it still works."""
    rt = upgraded
    assert rt.store.pending_migrations() == []
    catch_up(rt)
    assert rt.verify() == []
    rows = rt.store.all_rows()
    # Migration 0029 moved the lease and queued-since indexes onto generated columns on
    # PostgreSQL: the upgraded rows have them, so the reaper's walk finds the running run
    # once its lease (of an hour, from when the fixture was built) has run out, and the
    # oldest queued run is still found.
    health = rt.views.health()
    expired = {
        r.run_id
        for r in rows
        if r.status is RunStatus.RUNNING
        and r.lease_expires_at is not None
        and r.lease_expires_at < health.now
    }
    assert health.stale_leases == len(expired)
    assert {run.id for run in rt.store.stale(10)} == expired
    queued_at = [r.updated_at for r in rows if r.status is RunStatus.QUEUED]
    assert health.oldest_queued_at == min(queued_at)
    base = [r for r in rows if r.state.queue in BASE_QUEUES]
    by_status = {s: [r for r in base if r.status is s] for s in RunStatus}
    assert len(by_status[RunStatus.COMPLETED]) == 3
    assert len(by_status[RunStatus.FAILED]) == 1  # dead-lettered
    assert len(by_status[RunStatus.WAITING_FOR_APPROVAL]) == 1
    assert len(by_status[RunStatus.RUNNING]) == 1  # a live lease of an hour
    assert len(by_status[RunStatus.QUEUED]) == 2  # one approved to resume, one never claimed
    for row in rows:
        assert rt.store.load(row.run_id) is not None
        assert rt.history(row.run_id)[0].version == 1
    # Migration 0032 put every run on the default queue at priority 0 (ADR 0077): a worker
    # of that queue alone claims them all, and the rows equal their rebuild (verify above).
    # A schema-32 database has its bulk run there still, at the priority it was changed to.
    placed = {(r.state.queue, r.state.priority) for r in base}
    bulk = version_of(request) >= QUEUES
    assert placed == ({("default", 0), ("bulk", 8)} if bulk else {("default", 0)})
    (waiting,) = by_status[RunStatus.WAITING_FOR_APPROVAL]
    rt.approve(waiting.run_id, by="upgrade-test", resume="queue")
    report = rt.work(burst=True, queues=["default"])
    assert report.outcomes == {"completed": 2 if bulk else 3}
    if bulk:
        assert rt.work(burst=True, queues=["bulk"]).outcomes == {"completed": 1}
    assert rt.get(waiting.run_id).status is RunStatus.COMPLETED
    assert [
        r.status for r in rt.runs(status="queued", limit=100) if r.state.queue in BASE_QUEUES
    ] == []
    catch_up(rt)
    assert rt.verify() == []
    counts = rt.views.status_counts()
    others = [r for r in rt.store.all_rows() if r.state.queue not in BASE_QUEUES]
    done_before = sum(r.status is RunStatus.COMPLETED for r in others)  # a child, rated runs
    assert sum(v for (_, s), v in counts.items() if s == "completed") == 6 + done_before
    # What migrations 0025 to 0030 changed, on the upgraded data: `runs --agent` walks its
    # own index (0025) and finds every run of the agent, newest first, and with a status
    # its (status, agent) slice (0030); the burst above ran through the claiming settle
    # (0026) and the once-planned claim (0028); a rebuild's clear counts the reasons down
    # per statement (0027) and the counts come back equal to a recount over the summaries.
    for agent in {r.state.agent for r in rows}:
        listed = rt.runs(agent=agent, limit=100)
        assert sorted(r.run_id for r in listed) == sorted(
            r.run_id for r in rt.store.all_rows() if r.state.agent == agent
        )
        assert [r.created_at for r in listed] == sorted(
            (r.created_at for r in listed), reverse=True
        )
        for status in {r.status for r in listed}:  # along the (status, agent) index (0030)
            assert [r.run_id for r in rt.runs(agent=agent, status=status, limit=100)] == [
                r.run_id for r in listed if r.status is status
            ]
    recount = Counter(
        (s.state.status.value, s.state.reason.value)
        for s in rt.views.summaries()
        if s.state.reason is not None
    )
    assert rt.views.reason_counts() == dict(recount)
    rt.rebuild("reporting")
    catch_up(rt)
    assert rt.views.reason_counts() == dict(recount)
    assert rt.verify() == []


JOURNALED = [v for v in VERSIONS if v >= 5]  # the step journal came with schema 5
KEPT = 31  # from the schema of ADR 0070 on, a failed run kept its journal when it settled
WAITS = [v for v in VERSIONS if v >= 31]  # durable sleep and signals (ADR 0073)
QUEUES = 32  # from the schema of ADR 0077 on, the fixture has a run on another queue


def version_of(request: pytest.FixtureRequest) -> int:
    return int(request.node.callspec.params["upgraded"])


@pytest.mark.parametrize("upgraded", JOURNALED, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__journal_of_runs_in_flight_survives(
    upgraded: Runtime, request: pytest.FixtureRequest
) -> None:
    """The journal entries of the runs that had not settled are still there after the
    upgrade (ADR 0050 moves them into their event rows on SQLite), each read back whole;
    settled runs have none, and a run that settles after the upgrade drops its journal."""
    rt = upgraded
    rows = rt.store.all_rows()
    waiting = [r for r in rows if r.state.agent == "fixture_wait" and not r.status.is_terminal]
    assert len(waiting) == 2
    for row in waiting:
        (entry,) = rt.store.journal(row.run_id)
        assert (entry.seq, entry.position, entry.kind, entry.name) == (1, 1, "llm", "draft")
        assert entry.value == "hello"
        assert not entry.failed
    for row in rows:
        if row.status.is_terminal:
            kept = row.status is RunStatus.FAILED and version_of(request) >= KEPT
            assert [e.name for e in rt.store.journal(row.run_id)] == (["try"] if kept else [])
    queued = next(r for r in waiting if r.status is RunStatus.QUEUED)
    report = rt.work(burst=True, queues=BASE_QUEUES)
    assert report.outcomes == {"completed": 2}  # the approved run and the never-claimed one
    assert rt.get(queued.run_id).status is RunStatus.COMPLETED
    assert rt.store.journal(queued.run_id) == []


@pytest.mark.parametrize("upgraded", VERSIONS, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__a_run_that_failed_before_journals_were_kept_retries_as_a_restart(
    upgraded: Runtime, request: pytest.FixtureRequest
) -> None:
    """The dead-lettered fixture run failed when a settle still deleted its journal: if it
    kept its request (schema 9 on), a retry plans a restart (nothing to replay), runs it from
    its request, and the run, failing again, now keeps its journal, so the next retry
    resumes after the recorded step (ADR 0070); without its request, the retry is refused."""
    rt = upgraded
    (dead,) = [r for r in rt.store.all_rows() if r.status is RunStatus.FAILED]
    if version_of(request) >= KEPT:  # it kept its journal: the retry resumes after `try`
        assert [e.name for e in rt.store.journal(dead.run_id)] == ["try"]
        assert rt.retry_plan(dead.run_id) == RetryPlan(RetryMode.RESUME, 2, ())
        rt.retry(dead.run_id, by="upgrade-test")
        rt.work(burst=True, queues=BASE_QUEUES)
        assert rt.get(dead.run_id).status is RunStatus.FAILED
        assert [e.name for e in rt.store.journal(dead.run_id)] == ["try"]
        return
    assert rt.store.journal(dead.run_id) == []
    if rt.store.saved(dead.run_id, "request") is None:
        with pytest.raises(IllegalTransition, match="no saved request"):
            rt.retry(dead.run_id, by="upgrade-test")
        return
    assert rt.retry_plan(dead.run_id) == RetryPlan(RetryMode.RESTART, 1, ())
    rt.retry(dead.run_id, by="upgrade-test")
    rt.work(burst=True, queues=BASE_QUEUES)
    assert rt.get(dead.run_id).status is RunStatus.FAILED
    assert [e.name for e in rt.store.journal(dead.run_id)] == ["try"]
    assert rt.retry_plan(dead.run_id) == RetryPlan(RetryMode.RESUME, 2, ())


@pytest.mark.parametrize("upgraded", WAITS, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__waiting_runs_and_kept_signals_survive(upgraded: Runtime) -> None:
    """The waits of a schema-31 database outlive the upgrade: the year-long sleeper stays
    asleep (its wake-up still ahead, the claim does not take it), each signal waiter still
    has the signal of another name in its inbox, and `go` wakes it: it completes with the
    payload, the deadline-bound one too, and the kept `other` signal is still not consumed."""
    rt = upgraded
    rows = {r.state.agent: [] for r in rt.store.all_rows()}
    for r in rt.store.all_rows():
        rows[r.state.agent].append(r)
    (sleeper,) = rows["fixture_sleep"]
    assert sleeper.status is RunStatus.WAITING_FOR_TIMER
    listeners = rows["fixture_event"]
    assert [r.status for r in listeners] == [RunStatus.WAITING_FOR_EVENT] * 2
    assert sorted(r.available_at is None for r in listeners) == [False, True]
    for run in listeners:
        assert [s["name"] for s in rt.store.signals(run.run_id)] == ["other"]
    # the fixture's queued runs only
    assert rt.work(burst=True, queues=BASE_QUEUES).outcomes == {"completed": 2}
    assert rt.get(sleeper.run_id).status is RunStatus.WAITING_FOR_TIMER
    for n, run in enumerate(listeners):
        rt.signal(run.run_id, "go", {"n": n}, by="upgrade-test")
    full = make_runtime(rt.settings.database_url, app=app, privacy_level="full")
    try:  # the results kept whole, to read the payload each waiter got
        assert full.work(burst=True, queues=BASE_QUEUES).outcomes == {"completed": 2}
    finally:
        full.close()
    for n, run in enumerate(listeners):
        assert rt.get(run.run_id).status is RunStatus.COMPLETED
        (done,) = [h.event for h in rt.history(run.run_id) if isinstance(h.event, Completed)]
        assert done.result == {"result": {"got": {"n": n}}}
        assert [s["name"] for s in rt.store.signals(run.run_id)] == ["other", "go"]
    assert rt.get(sleeper.run_id).status is RunStatus.WAITING_FOR_TIMER
    catch_up(rt)
    assert rt.verify() == []


SCHEDULED = [v for v in VERSIONS if v >= 33]  # schedules (ADR 0076)


@pytest.mark.parametrize("upgraded", SCHEDULED, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__schedules_survive_with_their_pause_and_next_tick(upgraded: Runtime) -> None:
    """The schedules of a schema-33 database outlive the upgrade: the same definitions, the
    operator's pause, the next tick; the scheduler reconciles them unchanged and fires the
    active one once its tick is due (moved into the past here), one run per tick."""
    rt = upgraded
    rows = {row.name: row for row in rt.schedules()}
    assert set(rows) == {"fixture-daily", "fixture-paused"}
    assert (rows["fixture-daily"].schedule.cron, rows["fixture-daily"].paused) == (
        "0 7 * * *",
        False,
    )
    assert rows["fixture-paused"].paused
    assert rows["fixture-paused"].schedule.missed.value == "latest"
    scheduler = rt.scheduler()
    assert {r.name: r for r in scheduler.reconcile()} == rows  # the code's definitions, kept
    store: Any = rt.store
    if store.backend == "sqlite":
        with store._write() as (cur, at):
            cur.execute("UPDATE steptrail_schedules SET next_tick_at = :t", {"t": at - 1_000_000})
    else:
        with store._connection() as conn:
            conn.execute(
                "UPDATE steptrail_schedules SET next_tick_at = now() - interval '1 second'"
            )
    report = scheduler.tick_once()
    assert report.enqueued == 1  # the daily one; the paused one waits for its operator
    assert scheduler.tick_once().enqueued == 0


@pytest.mark.parametrize("upgraded", VERSIONS, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__rate_limits_work_after_migration_36(upgraded: Runtime) -> None:
    """Every earlier schema gains the rate limit tables (ADR 0080): a limit is stored, its
    window grants one request and holds back the next, and `rate_limits` lists its use."""
    from steptrail.domain.rate_limits import RateLimit

    store: Any = upgraded.store
    store.define_rate_limits([RateLimit("upgrade", 1, 50, 60)], by="upgrade-test")
    assert store.acquire_rate("upgrade", 20, uuid.uuid4()).grant_id is not None
    assert store.acquire_rate("upgrade", 20, uuid.uuid4()).grant_id is None
    (row,) = [r for r in upgraded.rate_limits() if r.limit.name == "upgrade"]
    assert (row.limit.name, row.used_requests, row.used_tokens) == ("upgrade", 1, 20)


# Child runs (ADR 0075): agents of their own, run by a second runtime on the upgraded database.
FAMILY = App()


@FAMILY.agent("upgrade_child")
def upgrade_child(ctx: RunContext, request: dict[str, Any]) -> int:
    return int(request["n"]) * 10


@FAMILY.agent("upgrade_parent")
def upgrade_parent(ctx: RunContext, request: dict[str, Any]) -> list[Any]:
    handles = [ctx.start_child("upgrade_child", {"n": n}) for n in range(3)]
    return ctx.wait_all(handles)


@pytest.mark.parametrize("upgraded", VERSIONS, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__runs_stored_before_have_no_family_and_a_new_one_works(
    upgraded: Runtime,
) -> None:
    """Migration 0034 on every earlier schema: the runs stored before are nobody's children
    and have none (the new column is empty, the partial index has nothing in it; the family
    a schema-34 or later fixture stored is checked on its own below); a parent
    started after the upgrade fans out, its children find it by the column and it gets
    their results; the index still equals its rebuild."""
    rt = upgraded
    old = [r for r in rt.store.all_rows() if r.state.queue != "family"]
    assert {r.state.parent_id for r in old} == {None}
    assert [rt.store.children(r.run_id) for r in old] == [[] for _ in old]
    family = make_runtime(rt.settings.database_url, app=FAMILY, privacy_level="full")
    try:
        parent = family.enqueue("upgrade_parent", {})
        deadline = time.monotonic() + 30
        while not family.get(parent).status.is_terminal:
            assert time.monotonic() < deadline, family.get(parent).status
            family.work(burst=True)
        (done,) = [h.event for h in family.history(parent) if isinstance(h.event, Completed)]
        assert done.result == {"result": [0, 10, 20]}
        children = family.store.children(parent)
        assert sorted(c.state.parent_seq for c in children) == [1, 2, 3]
        assert family.family(children[0].run_id).parent == (
            parent,
            "upgrade_parent",
            RunStatus.COMPLETED,
        )
    finally:
        family.close()
    catch_up(rt)
    assert rt.verify() == []


@pytest.mark.parametrize("upgraded", VERSIONS, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__runs_have_no_key_and_keyed_runs_are_limited(upgraded: Runtime) -> None:
    """Migration 0035 (ADR 0078) on every fixture: the old runs have no concurrency key and
    are claimed as before; a keyed run enqueued after the upgrade is held to its key's
    limit, and the index still equals its rebuild (the keyed runs a schema-35 or later
    fixture stored are checked on their own below)."""
    rt = upgraded
    rows = [r for r in rt.store.all_rows() if r.state.queue != "keyed"]
    assert {(r.state.concurrency_key, r.state.concurrency_limit) for r in rows} == {(None, None)}
    rt.app.limit("tenant:*", 1)
    keyed = [rt.enqueue("fixture_ok", concurrency_key="tenant:a") for _ in range(3)]
    plain = [r.run_id for r in rows if r.status is RunStatus.QUEUED]
    claimed = rt.store.claim_batch(
        holder="worker:upgrade", lease_ms=60_000, agents=rt.app.agent_names, limit=16
    )
    by_key = Counter(c.run.state.concurrency_key for c in claimed if c.run.state.queue != "keyed")
    assert by_key == {None: len(plain), "tenant:a": 1}
    assert {c.run.id for c in claimed} >= set(plain)
    assert len({c.run.id for c in claimed} & set(keyed)) == 1
    assert rt.store.held_back(agents=rt.app.agent_names)
    assert rt.verify_index() == []


@pytest.mark.parametrize("upgraded", VERSIONS, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__an_idle_worker_sees_keyed_due_times(upgraded: Runtime) -> None:
    """Migration 0038 (ADR 0087) on every fixture: a keyed run put to sleep after the upgrade
    has its due time seen by `next_due_in` (a year away, on its own queue); a keyed run
    just enqueued is not counted (its enqueue wakes the workers), nor one held back behind
    a peer's run of its key; the keys table and the index stay true."""
    rt = upgraded
    store: Any = rt.store
    rt.app.queue("wake")
    rt.app.limit("wake:*", 1)
    before = rt.store.store_now()
    sleeper = rt.enqueue("fixture_sleep", {}, concurrency_key="wake:a", queue="wake")
    assert rt.work(burst=True, queues=["wake"]).outcomes == {"sleeping": 1}
    assert rt.get(sleeper).status is RunStatus.WAITING_FOR_TIMER
    due_in = store.next_due_in(agents=["fixture_sleep"], queues=["wake"])
    elapsed = (rt.store.store_now() - before).total_seconds()
    assert due_in is not None
    assert YEAR - elapsed <= due_in <= YEAR
    first = rt.enqueue("fixture_ok", concurrency_key="wake:b", queue="wake")
    assert store.next_due_in(agents=["fixture_ok"], queues=["wake"]) is None
    claimed = rt.store.claim_batch(
        holder="worker:peer", lease_ms=60_000, agents=["fixture_ok"], limit=1, queues=["wake"]
    )
    assert [c.run.id for c in claimed] == [first]
    rt.enqueue("fixture_ok", concurrency_key="wake:b", queue="wake")  # held back behind it
    assert store.next_due_in(agents=["fixture_ok"], queues=["wake"]) is None
    assert key_table(rt)["wake:b"] == (1, 1)
    assert rt.verify_index() == []


# The features of schema 34 to 36 with the fixture's own runs in them (see populate.py).
# Version 35 was built on the branch of concurrency keys, before child runs were merged.
FAMILIES = [v for v in VERSIONS if v == 34 or v >= 36]
KEYED = [v for v in VERSIONS if v >= 35]
RATED = [v for v in VERSIONS if v >= 36]
RATE_LIMIT = "fixture-llm"


@contextmanager
def clock_ahead(rt: Runtime, seconds: float) -> Iterator[Runtime]:
    """A second runtime over the upgraded database whose store clock reads `seconds` ahead,
    results kept whole: on SQLite the store's offset, on PostgreSQL the testing kit's
    skippable clock (ADR 0034) installed into this copy, which only new connections read."""
    url = rt.settings.database_url
    if rt.store.backend == "postgres":
        if not pgclock.installed(url):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(pgclock.INSTALL.encode())
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET search_path = public, {}, pg_catalog").format(
                        sql.Identifier(url.rpartition("/")[2]), sql.Identifier(pgclock.SCHEMA)
                    )
                )
        pgclock.skip(url, seconds)
    later = make_runtime(url, app=app, privacy_level="full")
    try:
        if later.store.backend == "sqlite":
            store: Any = later.store
            store.clock_offset_us = round(seconds * 1_000_000)
        yield later
    finally:
        later.close()


def execute(rt: Runtime, statement: dict[str, str], **params: Any) -> list[Any]:
    """One statement of the test's own on the upgraded database, as written per backend."""
    store: Any = rt.store
    if store.backend == "sqlite":
        with store._write() as (cur, _):
            return list(cur.execute(statement["sqlite"], params).fetchall())
    with store._connection() as conn:
        cur = conn.execute(statement["postgres"], params)
        return list(cur.fetchall()) if cur.description else []


@pytest.mark.parametrize("upgraded", FAMILIES, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__a_family_keeps_its_links_and_inbox_and_finishes(upgraded: Runtime) -> None:
    """A parent stored waiting for its second child, its first one completed, outlives the
    migrations after 0034: both children name it (index column and `Runtime.family`, as
    `show` prints them), the first child's signal is still in its inbox unconsumed, and a
    worker runs the queued child, which wakes the parent, which completes with both results."""
    rt = upgraded
    (parent,) = [r for r in rt.store.all_rows() if r.state.agent == "fixture_parent"]
    assert parent.status is RunStatus.WAITING_FOR_EVENT
    children = sorted(rt.store.children(parent.run_id), key=lambda c: c.state.parent_seq or 0)
    assert [(c.state.parent_id, c.state.queue) for c in children] == [(parent.run_id, "family")] * 2
    (done,) = [c for c in children if c.status is RunStatus.COMPLETED]
    (queued,) = [c for c in children if c.status is RunStatus.QUEUED]
    assert [s["name"] for s in rt.store.signals(parent.run_id)] == [
        f"steptrail.child:{done.run_id}"
    ]
    family = rt.family(parent.run_id)
    assert (family.parent_id, family.parent) == (None, None)
    assert family.children == [(c.run_id, "fixture_child", c.status) for c in children]
    assert family_lines(family) == [
        "children (2):",
        *(f"  {c.run_id} fixture_child {c.status.value}" for c in children),
    ]
    for child in children:
        up = rt.family(child.run_id)
        assert up.parent == (parent.run_id, "fixture_parent", RunStatus.WAITING_FOR_EVENT)
        assert family_lines(up) == [f"parent: {parent.run_id} fixture_parent waiting_for_event"]
    full = make_runtime(rt.settings.database_url, app=app, privacy_level="full")
    try:  # the results kept whole, to read what the parent got
        assert full.work(burst=True, queues=["family"]).outcomes == {"completed": 2}
        (end,) = [h.event for h in full.history(parent.run_id) if isinstance(h.event, Completed)]
    finally:
        full.close()
    assert end.result == {"result": [10, 20]}
    assert {status for _, _, status in rt.family(parent.run_id).children} == {RunStatus.COMPLETED}
    assert [s["name"] for s in rt.store.signals(parent.run_id)] == [
        f"steptrail.child:{done.run_id}",
        f"steptrail.child:{queued.run_id}",
    ]
    catch_up(rt)
    assert rt.verify() == []


@pytest.mark.parametrize("upgraded", KEYED, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__keyed_runs_keep_their_places_and_drain(upgraded: Runtime) -> None:
    """Runs stored under concurrency keys outlive the migrations after 0035: each keeps its
    key and limit, the keys table's running and pending counts equal a recount of the run
    index (two running and one pending on key a, one of each on b), a claim still stops at a
    key's limit, and once the dead workers' leases run out the reaper puts their runs back
    and a worker drains every keyed run, the counts back to none."""
    rt = upgraded
    keyed = [r for r in rt.store.all_rows() if r.state.queue == "keyed"]
    assert sorted((r.state.concurrency_key, r.status.value) for r in keyed) == [
        ("fixture-tenant:a", "queued"),
        ("fixture-tenant:a", "running"),
        ("fixture-tenant:a", "running"),
        ("fixture-tenant:b", "queued"),
        ("fixture-tenant:b", "running"),
    ]
    assert {r.state.concurrency_limit for r in keyed} == {2}
    assert key_table(rt) == {"fixture-tenant:a": (2, 1), "fixture-tenant:b": (1, 1)}
    claimed = rt.store.claim_batch(
        holder="worker:upgrade", lease_ms=60_000, agents=["fixture_keyed"], limit=16
    )
    assert [c.run.state.concurrency_key for c in claimed] == ["fixture-tenant:b"]  # a is full
    assert key_table(rt) == {"fixture-tenant:a": (2, 1), "fixture-tenant:b": (2, 0)}
    with clock_ahead(rt, 2 * 3600) as later:  # every lease taken at the build has run out
        running = [r.run_id for r in later.store.all_rows() if r.status is RunStatus.RUNNING]
        report = later.reap()
        assert (report.requeued, report.dead_lettered) == (len(running), 0)
        assert key_table(later) == {"fixture-tenant:a": (0, 3), "fixture-tenant:b": (0, 2)}
        assert later.work(burst=True, queues=["keyed"]).outcomes == {"completed": 5}
        assert {later.get(r.run_id).status for r in keyed} == {RunStatus.COMPLETED}
        assert key_table(later) == {}
        assert later.verify_index() == []


GRANTS = {
    "sqlite": "SELECT run_id AS r, tokens AS t FROM steptrail_rate_grants WHERE limit_name = :n",
    "postgres": "SELECT run_id AS r, tokens AS t FROM steptrail_rate_grants"
    " WHERE limit_name = %(n)s",
}
# The fixture's grants were taken when it was built, and its window is a week: moved as one
# so that the newest is now, they are what the window holds right after the build.
GRANTS_NOW = {
    "sqlite": "UPDATE steptrail_rate_grants SET granted_at = granted_at + (:now -"
    " (SELECT max(granted_at) FROM steptrail_rate_grants WHERE limit_name = :n))"
    " WHERE limit_name = :n",
    "postgres": "UPDATE steptrail_rate_grants SET granted_at = granted_at + (clock_timestamp() -"
    " (SELECT max(granted_at) FROM steptrail_rate_grants WHERE limit_name = %(n)s))"
    " WHERE limit_name = %(n)s",
}


@pytest.mark.parametrize("upgraded", RATED, indirect=True, ids=lambda v: f"schema{v}")
def test_upgrade__a_rate_limit_keeps_its_grants_and_window(upgraded: Runtime) -> None:
    """A rate limit stored with two grants outlives the upgrade: its definition equals the
    code's, its grants are the fixture's two runs' 100 tokens each, its window (two of three
    requests used) lets one more step through and suspends the next on the limit's timer,
    which wakes it to complete once the window has passed."""
    rt = upgraded
    (row,) = [r for r in rt.rate_limits() if r.limit.name == RATE_LIMIT]
    assert row.limit == app.rate_limits[RATE_LIMIT]
    assert row.blocked_until is None
    rated = [r for r in rt.store.all_rows() if r.state.agent == "fixture_rated"]
    assert {r.status for r in rated} == {RunStatus.COMPLETED}
    grants = execute(rt, GRANTS, n=RATE_LIMIT)
    assert sorted((UUID(str(g["r"])), int(g["t"])) for g in grants) == sorted(
        (r.run_id, 100) for r in rated
    )
    store: Any = rt.store
    execute(rt, GRANTS_NOW, n=RATE_LIMIT, now=store.now_us() if store.backend == "sqlite" else 0)
    (row,) = [r for r in rt.rate_limits() if r.limit.name == RATE_LIMIT]
    assert (row.used_requests, row.used_tokens) == (2, 200)
    first, second = (rt.enqueue("fixture_rated", {}, queue="rated") for _ in range(2))
    rt.work(burst=True, queues=["rated"])
    assert rt.get(first).status is RunStatus.COMPLETED  # the third request of the window
    assert rt.get(second).status is RunStatus.WAITING_FOR_TIMER  # the window is full
    (row,) = [r for r in rt.rate_limits() if r.limit.name == RATE_LIMIT]
    assert (row.used_requests, row.used_tokens) == (3, 300)
    with clock_ahead(rt, row.limit.per_s + row.limit.margin_s + 60) as later:
        assert later.work(burst=True, queues=["rated"]).outcomes == {"completed": 1}
        assert later.get(second).status is RunStatus.COMPLETED
        (row,) = [r for r in later.rate_limits() if r.limit.name == RATE_LIMIT]
        assert (row.used_requests, row.used_tokens) == (1, 100)
        assert later.verify_index() == []
