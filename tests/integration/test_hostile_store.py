"""Hostile input at the store (issue 11): rows that cannot be read the fast way, schemas at
every earlier version, vacuum after purge, metrics scrapes that only read. Both backends."""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from steptrail.cli import cli
from steptrail.domain.errors import UnreadableEvent, UnreadableRun
from steptrail.domain.run import Run
from steptrail.infrastructure.codec import CLIPPED
from steptrail.infrastructure.factory import SchemaMissing, open_store
from steptrail.infrastructure.sqlfiles import migrations
from steptrail.runtime import Runtime
from steptrail.workers.projector import Projector
from tests.conftest import PG_ADMIN_URL, _url_for, make_runtime


def nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def project_until(rt: Runtime, done: Any, timeout: float = 30.0) -> None:
    """Project until `done()`: on PostgreSQL the runner folds a transaction only once no
    older one can still commit, which another session's open transaction may delay."""
    deadline = time.monotonic() + timeout
    while True:
        rt.project()
        if done():
            return
        assert time.monotonic() < deadline, "the views never caught up"
        time.sleep(0.05)


def write_legacy_deep_step(rt: Runtime, levels: int = 210) -> uuid.UUID:
    """A run whose log holds a step payload `levels` deep, as written before the bounds."""
    run_id = rt.enqueue("scripted", {})
    claimed = rt.store.claim(holder="w", lease_ms=60_000, agents=["scripted"])
    assert claimed is not None
    run = claimed.run
    run.record_step(kind="llm", name="deep", duration_ms=1, payload={"content": nested(levels)})
    rt.store.append(run)
    run.complete()
    rt.store.append(run)
    return run_id


def test_legacy_deep_row__every_reader_survives(runtime: Runtime) -> None:
    """An event too deep for the fast decoder is read with its content cut at the bound,
    by history, project, verify and rebuild alike."""
    run_id = write_legacy_deep_step(runtime)
    history = runtime.history(run_id)
    step = history[2].event
    assert isinstance(step, Run.StepRecorded)
    assert CLIPPED in str(step.payload)
    assert runtime.get(run_id).state.status.value == "completed"
    project_until(runtime, lambda: sum(runtime.views.status_counts().values()) == 1)
    assert runtime.verify() == []
    assert runtime.rebuild("all")["run-index"] == 1
    assert sum(runtime.views.status_counts().values()) == 1


def corrupt(rt: Runtime, run_id: uuid.UUID, version: int) -> None:
    """Overwrite one stored event with bytes that are not JSON (tampering, disk damage)."""
    if rt.backend == "postgres":
        with psycopg.connect(rt.store.url, autocommit=True) as conn:
            conn.execute(
                "UPDATE steptrail_events SET state = %s "
                "WHERE originator_id = %s AND originator_version = %s",
                (b"{not json", run_id, version),
            )
        return
    with rt.store.datastore.get_connection(commit=True) as conn, conn.cursor() as cur:  # type: ignore[union-attr]
        cur.execute(
            "UPDATE steptrail_events SET state = ? WHERE originator_id = ? "
            "AND originator_version = ?",
            (b"{not json", run_id.hex, version),
        )


def test_unreadable_row__reported_by_run_and_version(runtime: Runtime) -> None:
    """A row nobody can decode is reported naming its run and version; the projection
    runner logs it and keeps going without folding past it; other runs still show."""
    good = runtime.enqueue("scripted", {})
    bad = runtime.enqueue("scripted", {})
    corrupt(runtime, bad, 1)
    with pytest.raises(UnreadableEvent, match=f"event 1 of run {bad}"):
        runtime.history(bad)
    with pytest.raises(UnreadableEvent, match=f"run {bad}"):
        # On PostgreSQL the runner reads a transaction only once no older one is running
        # (cluster-wide), so it may take a few passes to reach the bad row.
        project_until(runtime, lambda: False)
    assert len(runtime.history(good)) == 1
    stop = threading.Event()
    projector = Projector(runtime.views, log=runtime.log)
    thread = threading.Thread(target=projector.run_forever, args=(0.01, stop))
    thread.start()
    try:
        thread.join(timeout=0.3)
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(timeout=5)


@contextmanager
def fresh_pg_database() -> Iterator[str]:
    """An empty PostgreSQL database (no schema), dropped afterwards."""
    name = f"steptrail_hostile_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _url_for(name)
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def empty_database(backend: str, tmp_path: Any) -> Iterator[str]:
    if backend == "postgres":
        with fresh_pg_database() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / f'{uuid.uuid4().hex}.db'}"


def test_migrate__from_every_earlier_version(backend: str, tmp_path: Any) -> None:
    """A database at every earlier schema version is brought up to date by `migrate` while
    auto-migrate is off, and then works."""
    numbers = [n for n, _, _ in migrations(backend)]
    for upto in [0, *numbers[:-1]]:
        with empty_database(backend, tmp_path) as url:
            store = open_store(url, ensure_schema=False)
            try:
                store.migrate(upto=upto)
                assert [p.split("_")[0] for p in store.pending_migrations()] == [
                    f"{n:04d}" for n in numbers if n > upto
                ]
            finally:
                store.close()
            with pytest.raises(SchemaMissing):
                open_store(url, migrate=False)
            store = open_store(url, ensure_schema=False)
            try:
                applied = store.migrate()
                assert [a.split("_")[0] for a in applied] == [
                    f"{n:04d}" for n in numbers if n > upto
                ]
            finally:
                store.close()
            rt = make_runtime(url, auto_migrate=False)
            try:
                run_id = rt.enqueue("scripted", {})
                rt.work(burst=True)
                assert rt.get(run_id).state.status.value == "completed"
                assert rt.verify() == []
            finally:
                rt.close()


def test_purge__vacuums_on_postgres(pg_url: str) -> None:
    """After a purge on PostgreSQL the log table has been vacuumed."""
    from tests.integration.test_retention import age

    rt = make_runtime(pg_url)
    try:
        ids = [rt.enqueue("scripted", {}) for _ in range(3)]
        age(rt, ids, days=45)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            before = conn.execute(
                "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'steptrail_events'"
            ).fetchone()
        rt.purge()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            after = conn.execute(
                "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'steptrail_events'"
            ).fetchone()
        assert before is not None
        assert after is not None
        assert after[0] > before[0]
    finally:
        rt.close()


def test_metrics_serve__scrapes_only_read(runtime: Runtime) -> None:
    """Served scrapes never fold the log (a run enqueued after the last projection is not
    counted until something projects) and a burst of scrapes shares one snapshot."""
    from prometheus_client.registry import CollectorRegistry

    from steptrail.metrics import MetricsServer, RunsCollector

    def queued() -> int | None:
        return runtime.views.status_counts().get(("scripted", "queued"))

    runtime.enqueue("scripted", {})
    project_until(runtime, lambda: queued() == 1)
    runtime.enqueue("scripted", {})
    collector = RunsCollector(runtime, cache_s=60.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server = MetricsServer("127.0.0.1", 0, registry, max_threads=4)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        bodies: list[str] = []

        def scrape() -> None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                bodies.append(r.read().decode())

        threads = [threading.Thread(target=scrape) for _ in range(60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(bodies) == 60
        assert all('steptrail_runs{agent="scripted",status="queued"} 1.0' in b for b in bodies)
        assert collector.reads == 1
    finally:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()
    project_until(runtime, lambda: queued() == 2)  # the second run was left unfolded


# -- a run whose row in the run index cannot be read (ADR 0066) ------------------------------


def damage_row(rt: Runtime, run_id: uuid.UUID) -> None:
    """Overwrite a run's document in the run index with JSON that is not an object."""
    if rt.backend == "postgres":
        with psycopg.connect(rt.store.url, autocommit=True) as conn:
            conn.execute(
                "UPDATE steptrail_runs SET doc = '\"damaged\"'::jsonb WHERE run_id = %s",
                (run_id,),
            )
        return
    with rt.store.datastore.get_connection(commit=True) as conn, conn.cursor() as cur:  # type: ignore[union-attr]
        cur.execute("UPDATE steptrail_runs SET doc = '\"damaged\"' WHERE run_id = ?", (run_id.hex,))


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if event in r.getMessage()]


def test_unreadable_row__the_run_is_read_from_its_log(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged row does not fail the listing, `show`, or the claim batch it is in: each
    reads that run from its log (and says so); a worker runs it with the rest, its next
    append writes the row again, and `verify` reports the row until then."""
    ids = [runtime.enqueue("scripted", {"steps": 1}) for _ in range(4)]
    bad = ids[2]
    damage_row(runtime, bad)
    with caplog.at_level("WARNING", logger="steptrail"):
        assert {r.run_id for r in runtime.runs()} == set(ids)
        assert runtime.get(bad).state.status.value == "queued"
    (warning, *_) = logged(caplog, "run_row_unreadable")
    assert str(bad) in warning
    (problem,) = runtime.verify("run-index")
    assert f"run index {bad}: the live row cannot be read" in problem
    report = runtime.work(concurrency=4, burst=True)
    assert report.outcomes.get("completed") == 4
    assert {runtime.get(i).state.status.value for i in ids} == {"completed"}
    assert runtime.verify("run-index") == []


def test_unreadable_run__claims_and_reaping_go_on_without_it(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A run whose row and log both cannot be read is left out of the claim batch and the
    reaper's pass that find it (and logged), instead of failing them: the other runs of the
    batch are run, the other stale runs reaped; reading it names it."""
    runtime = make_runtime(db_url, lease_seconds=0.5)
    try:
        lost = runtime.enqueue("scripted", {"steps": 1})
        damage_row(runtime, lost)
        corrupt(runtime, lost, 1)
        ids = [runtime.enqueue("scripted", {"steps": 1}) for _ in range(3)]
        with caplog.at_level("ERROR", logger="steptrail"):
            report = runtime.work(concurrency=4, burst=True)
        assert report.outcomes.get("completed") == 3
        assert {runtime.get(i).state.status.value for i in ids} == {"completed"}
        assert any(str(lost) in m for m in logged(caplog, "run_unreadable_skipped"))
        with pytest.raises(UnreadableRun, match=f"run {lost}: its row in the run index"):
            runtime.get(lost)
        with pytest.raises(UnreadableRun, match=f"run {lost}"):
            runtime.runs()

        # Two more stale runs beside it: one readable, one whose row alone is damaged.
        stale = [runtime.enqueue("scripted", {"steps": 1}) for _ in range(2)]
        for _ in stale:
            assert runtime.store.claim(holder="worker:dead", lease_ms=1, agents=["scripted"])
        damage_row(runtime, stale[1])
        time.sleep(0.6)  # the lost run's lease (0.5 s, from the worker's claim) has run out
        caplog.clear()
        with caplog.at_level("ERROR", logger="steptrail"):
            reaped = runtime.reap()
        assert reaped.requeued == 2
        assert {r["run_id"] for r in reaped.runs} == {str(s) for s in stale}
        assert any(str(lost) in m for m in logged(caplog, "run_unreadable_skipped"))
        assert {runtime.get(s).state.status.value for s in stale} == {"queued"}

        args = ["--database-url", runtime.settings.database_url, "show", str(lost)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1
        assert f"run {lost}: its row in the run index cannot be read" in result.output
    finally:
        runtime.close()


def retopic(rt: Runtime, run_id: uuid.UUID, version: int, topic: str) -> None:
    """Give one stored event a topic this steptrail does not know (as a newer one writes)."""
    if rt.backend == "postgres":
        with psycopg.connect(rt.store.url, autocommit=True) as conn:
            conn.execute(
                "UPDATE steptrail_events SET topic = %s "
                "WHERE originator_id = %s AND originator_version = %s",
                (topic, run_id, version),
            )
        return
    with rt.store.datastore.get_connection(commit=True) as conn, conn.cursor() as cur:  # type: ignore[union-attr]
        cur.execute(
            "UPDATE steptrail_events SET topic = ? WHERE originator_id = ? "
            "AND originator_version = ?",
            (topic, run_id.hex, version),
        )


def test_unknown_topic__readers_name_the_event(runtime: Runtime) -> None:
    """An event whose topic this version does not know (written by a newer one) is reported
    like any unreadable event, naming its run, version and topic: `show` and `verify` exit 1
    with one line instead of a traceback; other runs still show."""
    ids = [runtime.enqueue("scripted", {"steps": 1}) for _ in range(2)]
    runtime.work(concurrency=2, burst=True)
    retopic(runtime, ids[0], 2, "steptrail.run.FromANewerVersion")
    expected = (
        f"event 2 of run {ids[0]} cannot be read: its topic 'steptrail.run.FromANewerVersion'"
    )
    with pytest.raises(UnreadableEvent, match=re.escape(expected)):
        runtime.history(ids[0])
    assert len(runtime.history(ids[1])) == 4
    url = runtime.settings.database_url
    for args in (["show", str(ids[0])], ["verify", "run-index"]):
        result = CliRunner().invoke(cli, ["--database-url", url, *args])
        assert result.exit_code == 1, (args, result.output)
        assert expected in result.output
        assert "Traceback" not in result.output


def test_unreadable_runs__the_reaper_looks_past_them(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """Runs unreadable both ways hold the oldest stale leases and would fill every pass of
    `limit` rows: the reaper remembers them for a while, asks for that many more rows, and
    reaches the stale runs behind them; each is logged once, not at every pass."""
    ids = [runtime.enqueue("scripted", {"steps": 1}) for _ in range(4)]
    for run_id in ids:
        claimed = runtime.store.claim(holder="worker:dead", lease_ms=1, agents=["scripted"])
        assert claimed is not None
        assert claimed.run.id == run_id
        time.sleep(0.02)  # leases expire in this order
    *lost, good = ids
    for run_id in lost:
        damage_row(runtime, run_id)
        corrupt(runtime, run_id, 1)
    time.sleep(0.02)
    reaper = runtime.reaper()
    passes = []
    with caplog.at_level("ERROR", logger="steptrail"):
        for _ in range(3):
            caplog.clear()
            report = reaper.reap_once(2)
            skipped = logged(caplog, "run_unreadable_skipped")
            named = {r for r in lost if any(str(r) in m for m in skipped)}
            passes.append((report.requeued, named))
    assert passes == [(0, set(lost[:2])), (1, {lost[2]}), (0, set())]
    assert runtime.get(good).state.status.value == "queued"
