"""Claims, the reaper's scan and the stale-lease count cost their batch, not the history
(ADR 0037), whatever the planner's statistics say.

PostgreSQL: each case builds its database with raw SQL (fast) in one of three statistics
states — a backlog never analysed, a large finished history analysed while nothing was
queued or running and a backlog added after, and a backlog analysed — then runs the store's
real statements with auto_explain capturing the plans of the functions' inner statements
(ANALYZE, BUFFERS) and checks them structurally: which index, rows read, buffers touched —
bounded by the batch, never by the backlog. SQLite: EXPLAIN QUERY PLAN with and without
ANALYZE, and the virtual machine's instruction count (a progress handler), which must not
grow with the backlog. No timings.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from steptrail.domain.ports import ClaimRequest
from steptrail.infrastructure.factory import open_store
from steptrail.infrastructure.sqlfiles import queries
from steptrail.infrastructure.sqlite_queues import pick
from steptrail.infrastructure.sqlite_wake import _keyed_due
from tests.conftest import PG_ADMIN_URL, _url_for

LIMIT = 16
BACKLOG = 5_000  # queued runs of the agent the worker serves
OTHERS = 5_000  # queued runs of another agent, all available before the backlog
RUNNING = 2_000  # running runs with live leases
EXPIRED = 20  # running runs whose lease has expired
HISTORY = 30_000  # finished runs

PG_INSERT = """
INSERT INTO steptrail_runs (
    run_id, agent, status, version, requeue_count, doc,
    available_at, lease_expires_at, created_at, updated_at
)
SELECT gen_random_uuid(), %(agent)s, %(status)s, 2, 0, '{}'::jsonb,
       CASE WHEN %(status)s = 'queued'
            THEN now() - %(age_s)s * interval '1 second' + g * interval '1 ms' END,
       CASE WHEN %(status)s = 'running'
            THEN now() + %(lease_s)s * interval '1 second' END,
       now(), now()
FROM generate_series(1, %(n)s) AS g
"""

STATEMENTS = ("live_backlog", "history_then_backlog", "analysed_backlog")


# -- PostgreSQL --------------------------------------------------------------------------------


@pytest.fixture
def pg_fresh() -> Iterator[str]:
    """A database of its own (statistics are per database), migrated, autovacuum off on the
    run index so that nothing analyses it behind the test's back."""
    name = f"steptrail_planner_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        if os.environ.get("CI") == "true":  # under CI a PostgreSQL test fails, never skips
            pytest.fail(f"PostgreSQL unreachable: {error}")
        pytest.skip(f"PostgreSQL unreachable: {error}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _url_for(name)
    try:
        open_store(url).close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE steptrail_runs SET (autovacuum_enabled = off)")
        yield url
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _pg_fill(conn: psycopg.Connection[Any], state: str) -> None:
    def insert(
        agent: str, status: str, n: int, *, age_s: float = 3600, lease_s: float = 600
    ) -> None:
        conn.execute(
            PG_INSERT,
            {"agent": agent, "status": status, "n": n, "age_s": age_s, "lease_s": lease_s},
        )

    if state == "history_then_backlog":
        insert("a", "completed", HISTORY)
        conn.execute("ANALYZE steptrail_runs")  # nothing queued or running when analysed
    insert("other", "queued", OTHERS, age_s=7200)  # ahead of every run of agent a
    insert("a", "queued", BACKLOG)
    insert("a", "running", RUNNING)
    insert("a", "running", EXPIRED, lease_s=-60)
    # Every unfinished run keeps its request, as in a live database: the claim reads the
    # claimed runs' requests, and must find each by its key whatever the table holds.
    conn.execute(
        "INSERT INTO steptrail_saved (run_id, kind, body) SELECT run_id, 'request', '{}'"
        " FROM steptrail_runs WHERE status IN ('queued', 'running')"
    )
    if state == "analysed_backlog":
        conn.execute("ANALYZE steptrail_runs")
        conn.execute("ANALYZE steptrail_saved")


def _plans(conn: psycopg.Connection[Any], run: Any) -> list[dict[str, Any]]:
    """The plans (with actual rows and buffers) of every statement `run` executes, nested
    ones included, in a transaction that is rolled back."""
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.Error as error:  # pragma: no cover - a server without contrib
        if os.environ.get("CI") == "true":
            pytest.fail(f"auto_explain is not available: {error}")
        pytest.skip(f"auto_explain is not available: {error}")
    for setting, value in (
        ("log_min_duration", "0"),
        ("log_nested_statements", "on"),
        ("log_analyze", "on"),
        ("log_buffers", "on"),
        ("log_format", "json"),
        ("log_level", "notice"),
    ):
        conn.execute(f"SET auto_explain.{setting} = {value}")
    found: list[dict[str, Any]] = []

    def collect(diagnostic: psycopg.errors.Diagnostic) -> None:
        text = diagnostic.message_primary or ""
        if text.startswith("duration:") and "\n" in text:
            found.append(json.loads(text.split("\n", 1)[1]))

    conn.add_notice_handler(collect)
    with conn.transaction():
        run()
        raise psycopg.Rollback()
    conn.execute("SET auto_explain.log_min_duration = -1")
    return found


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _inner(plans: list[dict[str, Any]], marker: str) -> dict[str, Any]:
    (plan,) = [p["Plan"] for p in plans if p["Query Text"].lstrip().startswith(marker)]
    return plan


def _buffers(node: dict[str, Any]) -> int:
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


def _scans_of_runs(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        n
        for n in _nodes(plan)
        if n.get("Relation Name") == "steptrail_runs" and n["Node Type"].endswith("Scan")
    ]


# The one statement of steptrail_claim (migration 0018, ADR 0048): lock pass, event, update.
CLAIM_MARKER = "WITH RECURSIVE clock AS MATERIALIZED"
CLAIM_INDEX = "steptrail_runs_claim_idx"
# Keyed runs' index (ADR 0078): walked per key the claim visits, never otherwise.
KEYED_INDEX = "steptrail_runs_keyed_idx"
# Keyed runs claimable now or later by (agent, queue, available_at): an idle worker's wait
# (ADR 0087), never the claim.
KEYED_DUE_INDEX = "steptrail_runs_keyed_due_idx"
KEYED_RECENT = 32  # the latest due keyed runs steptrail_next_due looks at (migration 0038)


def _claim_scans(plan: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The claim's scans of the run index: the lock pass's walks of the claim index, and the
    rest (the update finding the picked rows), which must all go by primary key. The
    descents that find the queues and priority levels (ADR 0077) are checked here: each is
    a scan of the claim index that reads at most one entry per loop."""
    scans = _scans_of_runs(plan)
    on_claim_index = [n for n in scans if n.get("Index Name") == CLAIM_INDEX]
    walks = [n for n in on_claim_index if "available_at <= now()" in n.get("Index Cond", "")]
    descents = [n for n in on_claim_index if n not in walks]
    assert descents, "the levels are found by descents of the claim index"
    for n in descents:
        assert n["Node Type"] in ("Index Scan", "Index Only Scan"), n
        assert _read(n) <= int(n.get("Actual Loops", 1)), n
        assert _buffers(n) <= 4 * int(n.get("Actual Loops", 1)) + 4, n
    keyed = [n for n in scans if n.get("Index Name") == KEYED_INDEX]
    assert all(int(n.get("Actual Loops", 0)) == 0 for n in keyed), "no key was visited"
    by_key = [n for n in scans if n not in on_claim_index and n not in keyed]
    assert all(n.get("Index Name") == "steptrail_runs_pkey" for n in by_key), by_key
    return walks, by_key


def _queue_descents(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The descents that looked for an agent's next queue (a claim that names none): in the
    plan either way, run only then."""
    return [
        n
        for n in _scans_of_runs(plan)
        if n.get("Index Name") == CLAIM_INDEX
        and "queue > " in n.get("Index Cond", "")
        and int(n.get("Actual Loops", 0)) > 0
    ]


def _read(node: dict[str, Any]) -> int:
    """Rows a scan read: returned plus filtered out, over every loop."""
    loops = int(node.get("Actual Loops", 1))
    kept = int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
    return kept * loops


def _claim_with_plans(
    url: str, state: str, agents: list[str], queues: list[str] | None = None
) -> tuple[list[Any], list[dict[str, Any]]]:
    """One claim of a batch for `agents` (of `queues`, None: every queue) on a database
    filled as `state`: its rows, and the plans of every statement it ran."""
    params = {
        "agents": agents,
        "queues": queues,
        "topic": "steptrail.Run.Claimed",
        "state": b"{}",
        "holder": "worker:planner",
        "lease_ms": 60_000,
        "limit": LIMIT,
    }
    claim = queries("postgres")["claim"]
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _pg_fill(conn, state)
        got: dict[str, Any] = {}
        plans = _plans(conn, lambda: got.update(rows=conn.execute(claim, params).fetchall()))
    return got["rows"], plans


@pytest.mark.parametrize("queues", [None, ["default"]], ids=["every-queue", "one-queue"])
@pytest.mark.parametrize("state", STATEMENTS)
def test_pg_claim__walks_the_claim_index_for_one_batch(
    pg_fresh: str, state: str, queues: list[str] | None
) -> None:
    rows, plans = _claim_with_plans(pg_fresh, state, ["a"], queues)
    assert len(rows) == LIMIT
    # The disabled steps' costs must not make the server compile the claim (jit = off).
    assert not [p["Query Text"][:40] for p in plans if "JIT" in p]
    inner = _inner(plans, CLAIM_MARKER)
    walks, by_key = _claim_scans(inner)
    assert [(n["Node Type"], n.get("Index Name")) for n in walks] == [
        ("Index Scan", "steptrail_runs_claim_idx")
    ]
    assert _read(walks[0]) <= LIMIT  # not the backlog, nor the other agent's runs ahead
    assert _buffers(walks[0]) <= 4 * LIMIT + 20
    assert not any(n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan") for n in _nodes(inner))
    # The writes find the picked runs by key, never by scanning: each lookup has its key as
    # its condition and, over all its loops, reads the batch (a hash join over the whole
    # run index would read every run through the key index; ADR 0060).
    assert by_key
    assert all(n["Node Type"] == "Index Scan" for n in by_key)
    assert all("Index Cond" in n and _read(n) <= LIMIT for n in by_key), by_key
    # No join hashes or merges a whole table: the requests are read by key too, and a plan
    # made once for any LIMIT (ADR 0060) must not trade the lookups for a scan of every row.
    joins = {n["Node Type"] for n in _nodes(inner)} & {"Hash", "Hash Join", "Merge Join"}
    assert not joins, joins
    saved = [n for n in _nodes(inner) if n.get("Relation Name") == "steptrail_saved"]
    assert saved
    assert all("Index Cond" in n and _read(n) <= LIMIT for n in saved), saved
    # A claim that names its queues looks for none (ADR 0077).
    assert bool(_queue_descents(inner)) is (queues is None)


SLEEPERS = 5_000  # waiting runs of agent a whose deadline is an hour away


@pytest.mark.parametrize("queues", [None, ["default"]], ids=["every-queue", "one-queue"])
@pytest.mark.parametrize("state", STATEMENTS)
def test_pg_claim__priority_levels_first_and_sleepers_cost_nothing(
    pg_fresh: str, state: str, queues: list[str] | None
) -> None:
    """Priorities 9 and 3 are claimed before the priority-0 backlog, in one batch; the
    sleepers at each level, after now() in the claim index, are never read (ADR 0077 keeps
    ADR 0068's promise), and neither is another queue's backlog."""
    with psycopg.connect(pg_fresh, autocommit=True) as conn:
        for priority in (0, 3, 9):
            conn.execute(
                "INSERT INTO steptrail_runs (run_id, agent, status, version, requeue_count, doc,"
                " available_at, created_at, updated_at, queue, priority)"
                " SELECT gen_random_uuid(), 'a', 'waiting_for_timer', 3, 0, '{}'::jsonb,"
                " now() + interval '1 hour' + g * interval '1 ms', now(), now(), 'default', %s"
                " FROM generate_series(1, %s) AS g",
                (priority, SLEEPERS),
            )
        conn.execute(
            "INSERT INTO steptrail_runs (run_id, agent, status, version, requeue_count, doc,"
            " available_at, created_at, updated_at, queue, priority)"
            " SELECT gen_random_uuid(), 'a', 'queued', 1, 0, '{}'::jsonb,"
            " now() - interval '1 minute' + g * interval '1 ms', now(), now(), q, p"
            " FROM generate_series(1, 5) AS g,"
            " (VALUES ('default', 9), ('default', 3), ('heavy', 50)) AS v(q, p)"
        )
        conn.execute(
            "INSERT INTO steptrail_runs (run_id, agent, status, version, requeue_count, doc,"
            " available_at, created_at, updated_at, queue)"
            " SELECT gen_random_uuid(), 'a', 'queued', 1, 0, '{}'::jsonb,"
            " now() - interval '2 hours' + g * interval '1 ms', now(), now(), 'heavy'"
            " FROM generate_series(1, %s) AS g",
            (BACKLOG,),
        )
    rows, plans = _claim_with_plans(pg_fresh, state, ["a"], queues)
    got = [(row["queue"], row["priority"]) for row in rows]
    top = [("default", 9)] * 5 + [("default", 3)] * 5
    if queues is None:  # the heavy queue's 50s first; at 0, its older backlog
        expected = [("heavy", 50)] * 5 + top + [("heavy", 0)] * (LIMIT - 15)
    else:
        expected = top + [("default", 0)] * (LIMIT - 10)
    assert sorted(got, key=lambda g: -g[1]) == expected
    inner = _inner(plans, CLAIM_MARKER)
    walks, _ = _claim_scans(inner)
    (walk,) = walks  # one walk of the claim index, looped once per level
    levels = int(walk.get("Actual Loops", 1))
    assert levels <= 3 * (1 if queues else 2)
    assert _read(walk) <= levels * LIMIT  # never a sleeper, never the other queue's backlog
    assert _buffers(walk) <= levels * (4 * LIMIT + 20)


@pytest.mark.parametrize("state", STATEMENTS)
def test_pg_claim__several_agents_still_one_batch_each(pg_fresh: str, state: str) -> None:
    """A worker serving several agents walks each agent's runs for one batch at most."""
    rows, plans = _claim_with_plans(pg_fresh, state, ["a", "other", "nobody"])
    # The other agent's runs became available first: they are the batch.
    assert [row["agent"] for row in rows] == ["other"] * LIMIT
    inner = _inner(plans, CLAIM_MARKER)
    walks, _ = _claim_scans(inner)
    (scan,) = walks  # one index walk, looped once per agent
    assert scan["Index Name"] == "steptrail_runs_claim_idx"
    assert _read(scan) <= 3 * LIMIT
    assert _buffers(scan) <= 3 * (4 * LIMIT + 20)


@pytest.mark.parametrize("state", STATEMENTS)
def test_pg_reaper_scan_and_stale_count__walk_the_lease_index(pg_fresh: str, state: str) -> None:
    q = queries("postgres")
    with psycopg.connect(pg_fresh, autocommit=True) as conn:
        _pg_fill(conn, state)
        got: dict[str, Any] = {}

        def run() -> None:
            got["stale"] = conn.execute(q["select_stale"], {"limit": 100}).fetchall()
            got["health"] = conn.execute(q["queue_health"], {}).fetchone()

        plans = _plans(conn, run)
    assert len(got["stale"]) == EXPIRED
    assert got["health"][1] == EXPIRED
    for marker in ("SELECT * FROM steptrail_runs", "SELECT count(*)"):
        inner = _inner(plans, marker)
        scans = _scans_of_runs(inner)
        assert len(scans) == 1
        assert scans[0]["Node Type"] in ("Index Scan", "Index Only Scan")
        assert scans[0]["Index Name"] == "steptrail_runs_lease_due_idx"
        assert _read(scans[0]) <= EXPIRED  # the stale runs, not every running one
        assert _buffers(inner) <= EXPIRED + 20


# steptrail_next_due's one statement (migration 0037, ADR 0082).
NEXT_DUE_MARKER = "WITH RECURSIVE found"


@pytest.mark.parametrize("state", STATEMENTS)
def test_pg_next_due__reads_one_entry_per_level_whatever_sleeps(pg_fresh: str, state: str) -> None:
    """An idle worker's due-time read walks the claim index: one descent per queue and per
    priority level and one entry per level, never the sleepers behind a level's first run
    nor the backlog, and it is not compiled (jit = off); its answer is the earliest due
    time over every level (ADR 0082)."""
    with psycopg.connect(pg_fresh, autocommit=True, row_factory=dict_row) as conn:
        _pg_fill(conn, state)
        for priority, minutes in ((0, 30), (3, 20), (9, 40)):
            conn.execute(
                "INSERT INTO steptrail_runs (run_id, agent, status, version, requeue_count, doc,"
                " available_at, created_at, updated_at, queue, priority)"
                " SELECT gen_random_uuid(), 'b', 'waiting_for_timer', 3, 0, '{}'::jsonb,"
                " now() + %s * interval '1 minute' + g * interval '1 ms', now(), now(),"
                " 'default', %s FROM generate_series(1, %s) AS g",
                (minutes, priority, SLEEPERS),
            )
        got: dict[str, Any] = {}
        next_due = queries("postgres")["next_due"]

        def run() -> None:
            got.update(conn.execute(next_due, {"agents": ["b"], "queues": None}).fetchone())

        plans = _plans(conn, run)
    assert 19 * 60 < got["due_in_s"] <= 20 * 60 + 1  # priority 3's first sleeper
    assert not [p["Query Text"][:40] for p in plans if "JIT" in p]
    (inner,) = [p["Plan"] for p in plans if NEXT_DUE_MARKER in p["Query Text"]]
    scans = _scans_of_runs(inner)
    plain = [n for n in scans if n.get("Index Name") == CLAIM_INDEX]
    assert plain
    # The keyed part (ADR 0087) walks its own index, and here finds no keyed run at all.
    keyed = [n for n in scans if n not in plain]
    assert all(n.get("Index Name") == KEYED_DUE_INDEX for n in keyed), keyed
    assert sum(_read(n) for n in keyed) == 0, keyed
    assert all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in scans), scans
    for n in plain:  # at most one entry per loop: a descent, never a walk of the sleepers
        assert _read(n) <= int(n.get("Actual Loops", 1)), n
    assert _buffers(inner) <= 200


KEYS = 2_000  # keys with runs to take, five each
FULL_KEYS = 1_000  # keys whose two places are taken, with a backlog of five each


def _pg_fill_keyed(conn: psycopg.Connection[Any], *, free_due: bool = True) -> None:
    """Keyed runs of agent a (limit 2 per key), through the run index's triggers: KEYS keys
    with five due runs each (not if `free_due` is false), FULL_KEYS keys with two running
    and five due, and sleepers (five per key of KEYS, in an hour)."""
    insert = (
        "INSERT INTO steptrail_runs (run_id, agent, status, version, requeue_count, doc,"
        " available_at, lease_expires_at, created_at, updated_at, concurrency_key,"
        " concurrency_limit)"
        " SELECT gen_random_uuid(), 'a', %(status)s, 2, %(requeues)s, '{}'::jsonb,"
        " CASE WHEN %(status)s <> 'running' THEN now() + %(at)s * interval '1 second'"
        "  + g * interval '1 us' END,"
        " CASE WHEN %(status)s = 'running' THEN now() + interval '10 minutes' END,"
        " now(), now(), %(prefix)s || (g %% %(keys)s), 2"
        " FROM generate_series(1, %(n)s) AS g"
    )
    for prefix, status, n, keys, at in (
        *(
            [("k:", "queued", 5 * KEYS, KEYS, -10_000)] if free_due else []
        ),  # before the plain backlog
        ("full:", "running", 2 * FULL_KEYS, FULL_KEYS, 0),
        ("full:", "queued", 5 * FULL_KEYS, FULL_KEYS, -20_000),
        ("k:", "waiting_for_timer", 5 * KEYS, KEYS, 3600),
    ):
        # The due runs were requeued (a backoff): in the keyed due index (ADR 0087), where
        # a run just enqueued is not; the full keys' are held back there.
        requeues = 1 if status == "queued" else 0
        conn.execute(
            insert,
            {
                "prefix": prefix,
                "status": status,
                "n": n,
                "keys": keys,
                "at": at,
                "requeues": requeues,
            },
        )


@pytest.mark.parametrize("state", STATEMENTS)
def test_pg_claim__keyed_runs_cost_their_batch(pg_fresh: str, state: str) -> None:
    """With thousands of keys (a thousand of them full) and a plain backlog, the claim reads
    at most a batch of keys from the ready index (a full key is not in it) and, per key, at
    most its free places from the keyed index: never the keys' backlogs or sleepers, never
    a full key's runs (ADR 0078)."""
    with psycopg.connect(pg_fresh, autocommit=True) as conn:
        _pg_fill_keyed(conn)
    rows, plans = _claim_with_plans(pg_fresh, state, ["a"], None)
    assert len(rows) == LIMIT
    keys = Counter(row["concurrency_key"] for row in rows)
    # The keyed runs came first (claimable first), at most two per key, never a full key's.
    assert max(keys.values()) <= 2, keys
    assert all(k.startswith("k:") for k in keys), keys
    inner = _inner(plans, CLAIM_MARKER)
    ready = [
        n
        for n in _nodes(inner)
        if n.get("Relation Name") == "steptrail_concurrency_keys"
        and n["Node Type"].endswith("Scan")
    ]
    assert [n.get("Index Name") for n in ready if int(n.get("Actual Loops", 0))] == [
        "steptrail_concurrency_keys_ready_idx"
    ], ready
    assert _read(ready[0]) <= LIMIT
    keyed = [n for n in _scans_of_runs(inner) if n.get("Index Name") == KEYED_INDEX]
    (walk,) = keyed
    assert int(walk["Actual Loops"]) <= LIMIT
    assert _read(walk) <= 2 * LIMIT  # each key's free places, not its backlog
    assert _buffers(walk) <= int(walk["Actual Loops"]) * 6 + 20
    assert not any(n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan") for n in _nodes(inner))


@pytest.mark.parametrize("free_due", [False, True], ids=["held_back", "free_due"])
@pytest.mark.parametrize("analysed", [False, True], ids=["live", "analysed"])
def test_pg_next_due__keyed_runs_cost_a_bounded_walk(
    pg_fresh: str, analysed: bool, free_due: bool
) -> None:
    """An idle worker's due-time read over thousands of keyed runs (ADR 0087): with every
    due keyed run held back by its full key, the answer is the sleepers' hour (the held-back
    runs do not count), and the read looks at no more than the latest KEYED_RECENT due runs
    and their keys, one descent for the sleepers, never the held-back backlog; with keys
    that have a free place and due runs, the answer is at most zero. The claim's own index
    is not read for keyed runs, the keyed one not at all."""
    with psycopg.connect(pg_fresh, autocommit=True, row_factory=dict_row) as conn:
        _pg_fill_keyed(conn, free_due=free_due)
        if analysed:
            conn.execute("ANALYZE steptrail_runs")
            conn.execute("ANALYZE steptrail_concurrency_keys")
        got: dict[str, Any] = {}
        next_due = queries("postgres")["next_due"]

        def run() -> None:
            got.update(conn.execute(next_due, {"agents": ["a"], "queues": None}).fetchone())

        plans = _plans(conn, run)
    if free_due:
        assert got["due_in_s"] <= 0
    else:
        assert 3600 - 60 < got["due_in_s"] <= 3601  # the sleepers' hour, from their insert
    (inner,) = [p["Plan"] for p in plans if NEXT_DUE_MARKER in p["Query Text"]]
    scans = _scans_of_runs(inner)
    keyed = [n for n in scans if n.get("Index Name") == KEYED_DUE_INDEX]
    assert keyed
    assert all(n.get("Index Name") in (CLAIM_INDEX, KEYED_DUE_INDEX) for n in scans), scans
    assert all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in scans), scans
    assert sum(_read(n) for n in keyed) <= KEYED_RECENT + 4, keyed
    key_rows = [
        n
        for n in _nodes(inner)
        if n.get("Relation Name") == "steptrail_concurrency_keys"
        and n["Node Type"].endswith("Scan")
    ]
    assert all(n.get("Index Name") == "steptrail_concurrency_keys_pkey" for n in key_rows)
    assert sum(int(n.get("Actual Loops", 0)) for n in key_rows) <= KEYED_RECENT
    # A few pages per entry looked at and per key row read, not the pages of the 5,000
    # held-back runs (and 10,000 due ones) behind them.
    assert _buffers(inner) <= 20 * KEYED_RECENT


# -- SQLite ------------------------------------------------------------------------------------

SQLITE_INSERT = """
WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < :n)
INSERT INTO steptrail_runs (
    run_id, agent, status, version, requeue_count, doc,
    available_at, lease_expires_at, created_at, updated_at
)
SELECT lower(hex(randomblob(16))), :agent, :status, 2, 0, '{}',
       CASE WHEN :status = 'queued' THEN :now - :age_us + i * 1000 END,
       CASE WHEN :status = 'running' THEN :now + :lease_us END,
       :now, :now
FROM g
"""
NOW_US = 1_800_000_000_000_000


def _sqlite_db(tmp_path: Path, *, backlog: int, running: int, analysed: bool) -> sqlite3.Connection:
    path = tmp_path / f"planner-{backlog}-{running}-{analysed}.db"
    open_store(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row

    def insert(agent: str, status: str, n: int, *, age_s: int = 3600, lease_s: int = 600) -> None:
        conn.execute(
            SQLITE_INSERT,
            {
                "agent": agent,
                "status": status,
                "n": n,
                "now": NOW_US,
                "age_us": age_s * 1_000_000,
                "lease_us": lease_s * 1_000_000,
            },
        )

    insert("a", "completed", HISTORY if analysed else 1)
    if analysed:
        conn.execute("ANALYZE")  # nothing queued or running when analysed
    insert("other", "queued", backlog, age_s=7200)
    insert("a", "queued", backlog)
    insert("a", "running", running)
    insert("a", "running", EXPIRED, lease_s=-60)
    conn.commit()
    return conn


def _steps(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> tuple[int, list[Any]]:
    """Virtual machine instructions `sql` executes, and its rows."""
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, 1)
    try:
        rows = conn.execute(sql, params).fetchall()
    finally:
        conn.set_progress_handler(None, 0)
    return count[0], rows


def _plan(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> list[str]:
    return [r["detail"] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


@pytest.mark.parametrize("analysed", [False, True], ids=["no-stats", "analysed"])
def test_sqlite_claim_and_stale__name_their_index_and_never_sort(
    tmp_path: Path, analysed: bool
) -> None:
    q = queries("sqlite")
    conn = _sqlite_db(tmp_path, backlog=BACKLOG, running=RUNNING, analysed=analysed)
    level = {"agent": "a", "queue": "default", "priority": 0, "now": NOW_US, "limit": LIMIT}
    for name, params in (
        ("claim", level),
        ("claim_queue_after", {"agent": "a", "after": ""}),
        ("claim_level_below", {"agent": "a", "queue": "default", "below": 2**62}),
    ):
        claim = _plan(conn, q[name], params)
        assert any("steptrail_runs_claim_idx" in d for d in claim), (name, claim)
        assert not any("TEMP B-TREE" in d for d in claim), (name, claim)
    stale = _plan(conn, q["select_stale"], {"now": NOW_US, "limit": 100})
    assert any("steptrail_runs_lease_idx" in d for d in stale), stale
    assert not any("TEMP B-TREE" in d for d in stale), stale
    health = _plan(conn, q["queue_health"], {"now": NOW_US})
    assert any("steptrail_runs_lease_idx" in d for d in health), health


def test_sqlite_claim_and_stale__cost_does_not_grow_with_the_backlog(tmp_path: Path) -> None:
    """Ten times the queued and running runs: the same work per claim, reap scan and count."""
    q = queries("sqlite")
    small = _sqlite_db(tmp_path, backlog=500, running=200, analysed=False)
    large = _sqlite_db(tmp_path, backlog=BACKLOG, running=RUNNING, analysed=False)
    level = {"agent": "a", "queue": "default", "priority": 0, "now": NOW_US, "limit": LIMIT}
    cases = [
        (q["claim"], level, LIMIT),
        (q["select_stale"], {"now": NOW_US, "limit": 100}, EXPIRED),
        (
            "SELECT count(*) FROM steptrail_runs INDEXED BY steptrail_runs_lease_idx "
            "WHERE status = 'running' AND lease_expires_at < :now",
            {"now": NOW_US},
            1,
        ),
    ]
    for sql, params, rows in cases:
        few, got_few = _steps(small, sql, params)
        many, got_many = _steps(large, sql, params)
        assert len(got_few) == len(got_many) == rows
        assert many <= few * 1.2 + 50, (sql[:60], few, many)
    # The stale count really is the one queue_health runs.
    assert "INDEXED BY steptrail_runs_lease_idx" in q["queue_health"]


def _pick_steps(conn: sqlite3.Connection, queues: tuple[str, ...] | None) -> tuple[int, list[Any]]:
    """Virtual machine instructions of the whole claim walk (queues, levels, batches)."""
    request = ClaimRequest(holder="h", lease_ms=1, agents=("a",), limit=LIMIT, queues=queues)
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, 1)
    try:
        rows = pick(conn.cursor(), queries("sqlite"), request, NOW_US)
    finally:
        conn.set_progress_handler(None, 0)
    return count[0], rows


def _add_levels(conn: sqlite3.Connection, sleepers: int) -> None:
    """Five due runs at priority 9 and at 3, and `sleepers` waiting runs an hour away at
    each of 0, 3 and 9, all of agent a in the default queue."""
    insert = (
        "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < :n)"
        " INSERT INTO steptrail_runs (run_id, agent, status, version, requeue_count, doc,"
        " available_at, created_at, updated_at, priority)"
        " SELECT lower(hex(randomblob(16))), 'a', :status, 2, 0, '{}', :at + i, :now, :now, :p"
        " FROM g"
    )
    for p in (9, 3):
        conn.execute(
            insert, {"n": 5, "status": "queued", "at": NOW_US - 10**6, "now": NOW_US, "p": p}
        )
    for p in (0, 3, 9):
        conn.execute(
            insert,
            {
                "n": sleepers,
                "status": "waiting_for_timer",
                "at": NOW_US + 3600 * 10**6,
                "now": NOW_US,
                "p": p,
            },
        )
    conn.commit()


@pytest.mark.parametrize("queues", [None, ("default",)], ids=["every-queue", "one-queue"])
def test_sqlite_claim__levels_first_and_sleepers_cost_nothing(
    tmp_path: Path, queues: tuple[str, ...] | None
) -> None:
    """The walk takes priority 9, then 3, then the backlog at 0, in one batch; ten times
    the sleepers at every level and the backlog cost it no more work (ADR 0077)."""
    small = _sqlite_db(tmp_path, backlog=500, running=200, analysed=False)
    large = _sqlite_db(tmp_path, backlog=BACKLOG, running=RUNNING, analysed=False)
    _add_levels(small, 500)
    _add_levels(large, 5_000)
    few, got_few = _pick_steps(small, queues)
    many, got_many = _pick_steps(large, queues)
    for rows in (got_few, got_many):
        assert [r["priority"] for r in rows] == [9] * 5 + [3] * 5 + [0] * (LIMIT - 10)
    assert many <= few * 1.2 + 50, (few, many)


def _add_keyed(conn: sqlite3.Connection, keys: int, *, free_due: bool = True) -> None:
    """`keys` keys of agent a (limit 2) with five due runs each (not if `free_due` is false)
    and as many sleepers, and `keys` full keys (two running, five due), through the run
    index's triggers."""
    insert = (
        "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < :n)"
        " INSERT INTO steptrail_runs (run_id, agent, status, version, requeue_count, doc,"
        " available_at, lease_expires_at, created_at, updated_at, concurrency_key,"
        " concurrency_limit)"
        " SELECT lower(hex(randomblob(16))), 'a', :status, 2, :requeues, '{}',"
        " CASE WHEN :status <> 'running' THEN :at + i END,"
        " CASE WHEN :status = 'running' THEN :now + 600000000 END,"
        " :now, :now, :prefix || (i % :keys), 2 FROM g"
    )
    for prefix, status, n, at in (
        *([("k:", "queued", 5 * keys, NOW_US - 10_000 * 10**6)] if free_due else []),
        ("full:", "running", 2 * keys, 0),
        ("full:", "queued", 5 * keys, NOW_US - 20_000 * 10**6),
        ("k:", "waiting_for_timer", 5 * keys, NOW_US + 3600 * 10**6),
    ):
        conn.execute(
            insert,
            {
                "n": n,
                "status": status,
                "at": at,
                "now": NOW_US,
                "prefix": prefix,
                "keys": keys,
                # The due runs were requeued (a backoff): in the keyed due index (ADR
                # 0087); the full keys' are held back there.
                "requeues": 1 if status == "queued" else 0,
            },
        )
    conn.commit()


def test_sqlite_claim__keyed_walk_does_not_grow_with_keys_or_backlogs(tmp_path: Path) -> None:
    """Ten times the keys, full keys, keyed backlog and sleepers: the same work per claim,
    and no key over its limit (ADR 0078)."""
    small = _sqlite_db(tmp_path, backlog=500, running=200, analysed=False)
    large = _sqlite_db(tmp_path, backlog=BACKLOG, running=RUNNING, analysed=False)
    _add_keyed(small, 200)
    _add_keyed(large, 2_000)
    few, got_few = _pick_steps(small, None)
    many, got_many = _pick_steps(large, None)
    for rows in (got_few, got_many):
        keys = Counter(r["concurrency_key"] for r in rows)
        assert len(rows) == LIMIT
        assert max(keys.values()) <= 2, keys
        assert all(k.startswith("k:") for k in keys), keys
    assert many <= few * 1.2 + 50, (few, many)
    for name, params in (
        ("claim_keys_ready", {"limit": LIMIT}),
        (
            "claim_keyed",
            {"key": "k:1", "now": NOW_US, "agents": '["a"]', "queues": None, "limit": 2},
        ),
    ):
        plan = _plan(large, queries("sqlite")[name], params)
        assert not any("TEMP B-TREE" in d for d in plan), (name, plan)
        assert any("_ready_idx" in d or "_keyed_idx" in d for d in plan), (name, plan)


def _keyed_due_steps(conn: sqlite3.Connection) -> tuple[int, list[int]]:
    """The virtual machine's instructions of the idle read's keyed part for agent a's
    default queue (ADR 0087), and the due times it gives."""
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, 1)
    try:
        got = list(_keyed_due(conn.cursor(), queries("sqlite"), "a", "default", NOW_US))
    finally:
        conn.set_progress_handler(None, 0)
    return count[0], got


@pytest.mark.parametrize("free_due", [False, True], ids=["held_back", "free_due"])
def test_sqlite_next_due__keyed_walk_does_not_grow_with_what_is_held_back(
    tmp_path: Path, free_due: bool
) -> None:
    """Ten times the keys, full keys' held-back runs and sleepers: the same work for an idle
    worker's keyed due time (at most KEYED_RECENT due runs and their keys looked at). With
    every due keyed run held back, the answer is the first sleeper's time; with free keys'
    due runs, one of those (passed) too (ADR 0087)."""
    small = _sqlite_db(tmp_path, backlog=500, running=200, analysed=False)
    large = _sqlite_db(tmp_path, backlog=BACKLOG, running=RUNNING, analysed=False)
    _add_keyed(small, 200, free_due=free_due)
    _add_keyed(large, 2_000, free_due=free_due)
    few, got_few = _keyed_due_steps(small)
    many, got_many = _keyed_due_steps(large)
    for got in (got_few, got_many):
        assert got[0] == NOW_US + 3600 * 10**6 + 1  # the first sleeper
        if free_due:
            (passed,) = got[1:]
            assert passed < NOW_US - 10_000 * 10**6 + 10 * 2_000  # a free key's due run
        else:
            assert got[1:] == []  # the held-back runs do not count
    assert many <= few * 1.2 + 50, (few, many)
    assert few <= KEYED_RECENT * 40 + 200, few
    for name in ("keyed_next_due_at", "keyed_came_due_at"):
        params = {"agent": "a", "queue": "default", "now": NOW_US, "recent": KEYED_RECENT}
        plan = _plan(large, queries("sqlite")[name], params)
        assert not any("TEMP B-TREE" in d for d in plan), (name, plan)
        assert any("steptrail_runs_keyed_due_idx" in d for d in plan), (name, plan)
