"""User projections: exactly-once folding, rebuild/verify, failure isolation; the event feed."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import pytest
from hypothesis import HealthCheck, given, settings

import steptrail
from examples.cost_per_agent_day import CostPerAgentDay
from steptrail import events
from steptrail.runtime import Runtime
from tests.conftest import make_runtime
from tests.integration.test_views import COMMANDS, apply_command, scripted_mix


def cost_app() -> steptrail.App:
    """A fresh App with the guide's example projection (each test registers its own)."""
    app = steptrail.App()
    app.add_projection("cost_per_agent_day", CostPerAgentDay())
    return app


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    """A runtime whose app has the projections guide's cost projection."""
    runtime = make_runtime(db_url, cost_app())
    yield runtime
    runtime.close()


def settle(rt: Runtime, *, batch: int = 1000) -> dict[str, int]:
    """Project until every projection that is not failing has folded the whole log; returns
    the events each folded. On PostgreSQL a transaction open anywhere in the shared cluster
    can hold readers back for a moment (ADR 0012), so one pass may not reach the head."""
    folded: dict[str, int] = defaultdict(int)
    for _ in range(200):
        for name, done in rt.project_all(batch=batch).items():
            if isinstance(done, int):
                folded[name] += done
        if all(t.lag == 0 for t in rt.tracked() if t.failure is None):
            return dict(folded)
        time.sleep(0.05)
    raise AssertionError(f"projections did not catch up: {rt.tracked()}")


def table(rt: Runtime, name: str) -> list[tuple[Any, ...]]:
    with rt.store.reporting_read() as tx:
        return sorted(tx.rows_of(name))


def fold_from_history(rt: Runtime, run_ids: list[UUID]) -> dict[tuple[str, str], list[Any]]:
    """The cost table computed straight from each run's trail."""
    expected: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, 0.0])
    for run_id in run_ids:
        agent = rt.get(run_id).state.agent
        for recorded in rt.history(run_id):
            if isinstance(recorded.event, events.StepRecorded):
                row = expected[(agent, recorded.recorded_at.date().isoformat())]
                row[0] += 1
                row[1] += recorded.event.tokens
                row[2] += recorded.event.cost
    return dict(expected)


def as_map(rows: list[tuple[Any, ...]]) -> dict[tuple[str, str], list[Any]]:
    return {(r[0], r[1]): [r[2], r[3], r[4]] for r in rows}


def assert_same_costs(live: dict[Any, list[Any]], expected: dict[Any, list[Any]]) -> None:
    assert live.keys() == expected.keys()
    for key, (steps, tokens, cost) in expected.items():
        assert live[key][:2] == [steps, tokens], key
        assert live[key][2] == pytest.approx(cost), key


def test_projection__folds_every_step_once_and_verifies(rt: Runtime) -> None:
    """The guide's example projection equals a fold of every run's trail; verify is clean."""
    run_ids = scripted_mix(rt)
    done = settle(rt, batch=7)
    assert done["cost_per_agent_day"] == done["reporting"] == rt.views.head()
    assert_same_costs(as_map(table(rt, "cost_per_agent_day")), fold_from_history(rt, run_ids))
    assert rt.verify("cost_per_agent_day") == []
    assert rt.verify() == []
    (status,) = [t for t in rt.tracked() if t.name == "cost_per_agent_day"]
    assert (status.lag, status.failure) == (0, None)
    assert status.position == rt.views.position()


def test_verify__reports_a_hand_altered_row_and_rebuild_restores_it(rt: Runtime) -> None:
    """A row changed by hand is drift; `rebuild NAME` gives back what the log says."""
    scripted_mix(rt)
    settle(rt)
    before = table(rt, "cost_per_agent_day")
    with rt.store.reporting_write() as tx:
        tx.sql().execute("UPDATE cost_per_agent_day SET tokens = tokens + 1")
    problems = rt.verify("cost_per_agent_day")
    assert len(problems) == 2 * len(before)
    assert any("is live but not in a rebuild" in p for p in problems)
    assert any("is in a rebuild but not live" in p for p in problems)
    assert rt.rebuild("cost_per_agent_day") == {"cost_per_agent_day": rt.views.head()}
    assert table(rt, "cost_per_agent_day") == before
    assert rt.verify("cost_per_agent_day") == []


class Flaky(steptrail.Projection):
    """Counts events per run; raises on every StepRecorded while `broken` is set."""

    tables = ("flaky_counts",)

    def __init__(self) -> None:
        self.broken = True

    def create_tables(self, sql: steptrail.Sql) -> None:
        sql.execute(
            "CREATE TABLE IF NOT EXISTS flaky_counts (run_id TEXT PRIMARY KEY, n INTEGER NOT NULL)"
        )

    def apply(self, event: events.RunEvent, ctx: steptrail.EventContext) -> None:
        if self.broken and isinstance(event, events.StepRecorded):
            raise ValueError("cannot fold steps yet")
        ctx.sql.execute(
            "INSERT INTO flaky_counts (run_id, n) VALUES (:r, 1)"
            " ON CONFLICT (run_id) DO UPDATE SET n = flaky_counts.n + 1",
            {"r": str(ctx.run_id)},
        )


def test_projection__that_raises_stops_alone_and_resumes_once_fixed(db_url: str) -> None:
    """A raising projection stands still at its position with the error on record; the views
    and the other projections go on; fixed, it resumes there and counts every event once."""
    app = cost_app()
    flaky = Flaky()
    app.add_projection("flaky", flaky)
    rt = make_runtime(db_url, app)
    try:
        scripted_mix(rt)
        done = settle(rt, batch=5)
        assert done["cost_per_agent_day"] == done["reporting"] == rt.views.head()
        status = {t.name: t for t in rt.tracked()}
        stuck = status["flaky"]
        assert stuck.failure is not None
        assert stuck.failure.error == "ValueError: cannot fold steps yet"
        assert stuck.failure.topic == events.StepRecorded.TOPIC
        assert stuck.failure.position > stuck.position
        assert stuck.lag > 0
        assert status["cost_per_agent_day"].failure is None
        assert status["cost_per_agent_day"].lag == 0
        assert isinstance(rt.project_all()["flaky"], steptrail.ProjectionFailed)
        again = {t.name: t for t in rt.tracked()}["flaky"].failure
        assert again is not None
        assert again.attempts == stuck.failure.attempts + 1  # each try is on record
        assert rt.projection("flaky").position() == stuck.position
        flaky.broken = False
        assert settle(rt)["flaky"] == stuck.lag
        resumed = {t.name: t for t in rt.tracked()}["flaky"]
        assert (resumed.failure, resumed.lag) == (None, 0)
        assert rt.verify("flaky") == []
        counts = dict(table(rt, "flaky_counts"))
        assert sum(counts.values()) == rt.views.head()
    finally:
        rt.close()


def test_projector__runs_projections_and_parks_a_failing_one(db_url: str) -> None:
    """The workers' runner keeps the projections too, and a failing one does not stop it."""
    app = cost_app()
    app.add_projection("flaky", Flaky())
    rt = make_runtime(db_url, app)
    try:
        scripted_mix(rt)
        read_all(rt, 1000, rt.views.head())  # wait until the whole log is visible (PostgreSQL)
        projector = rt.projector()
        assert projector.run_once() > 0
        assert projector.run_projections_once() is False
        status = {t.name: t for t in rt.tracked()}
        assert status["flaky"].failure is not None
        assert status["cost_per_agent_day"].position > (0, 0)
        assert projector.run_projections_once() is False  # flaky parked: not tried again
        status = {t.name: t for t in rt.tracked()}
        assert status["flaky"].failure.attempts == 1
    finally:
        rt.close()


def test_function_projection__registered_with_its_tables(db_url: str) -> None:
    """A plain function with create_tables= is a projection like a class; topics filter."""
    app = steptrail.App()

    def create(sql: steptrail.Sql) -> None:
        sql.execute("CREATE TABLE IF NOT EXISTS ends (run_id TEXT PRIMARY KEY, at TEXT)")

    @app.projection(
        "ends", tables=("ends",), create_tables=create, topics=(events.Completed.TOPIC,)
    )
    def ends(event: events.RunEvent, ctx: steptrail.EventContext) -> None:
        assert isinstance(event, events.Completed)
        ctx.sql.execute(
            "INSERT INTO ends (run_id, at) VALUES (:r, :at)",
            {"r": str(ctx.run_id), "at": ctx.recorded_at.isoformat()},
        )

    rt = make_runtime(db_url, app)
    try:
        scripted_mix(rt)
        settle(rt)
        assert len(table(rt, "ends")) == 3
        assert rt.verify("ends") == []
    finally:
        rt.close()


def test_app__refuses_projections_it_could_not_rebuild() -> None:
    """Names and tables are checked when a projection is registered."""
    app = steptrail.App()
    with pytest.raises(ValueError, match="tables"):
        app.add_projection("x", steptrail.Projection())
    with pytest.raises(ValueError, match="built-in"):
        app.add_projection("reporting", CostPerAgentDay())
    with pytest.raises(ValueError, match="letters"):
        app.add_projection("a b", CostPerAgentDay())

    class Sneaky(steptrail.Projection):
        tables = ("steptrail_events",)

    with pytest.raises(ValueError, match="may own"):
        app.add_projection("sneaky", Sneaky())


# -- the feed ----------------------------------------------------------------------------------


def read_all(rt: Runtime, page: int, expect: int) -> list[steptrail.FeedEntry]:
    """The whole feed (`expect` entries), resuming after each page's last position; waits
    while a transaction elsewhere in the shared cluster hides the tail (ADR 0012)."""
    got: list[steptrail.FeedEntry] = []
    position = (0, 0)
    deadline = time.monotonic() + 30
    while len(got) < expect and time.monotonic() < deadline:
        entries = rt.events(after=position, limit=page)
        got.extend(entries)
        if entries:
            position = entries[-1].position
        elif len(got) < expect:
            time.sleep(0.05)
    return got


def test_feed__pages_resume_without_gap_or_repeat(rt: Runtime) -> None:
    """Read in pages of any size, the feed is the log once, in the views' order."""
    run_ids = scripted_mix(rt)
    head = rt.views.head()
    whole = read_all(rt, 1000, head)
    log = sorted(
        (h.notification_id, rid, h.version, type(h.event).__name__)
        for rid in run_ids
        for h in rt.history(rid)
    )
    assert len(whole) == len(log)
    assert (
        sorted((e.position[1], e.run_id, e.version, type(e.event).__name__) for e in whole) == log
    )
    assert [e.position for e in whole] == sorted(e.position for e in whole)
    for page in (1, 3, 7):
        assert read_all(rt, page, head) == whole
    assert rt.events(after=whole[-1].position) == []


def test_feed__purged_positions_are_marked_not_lost(rt: Runtime) -> None:
    """After a purge, each position a purged event held comes back as a purged marker."""
    scripted_mix(rt)
    head = rt.views.head()
    before = read_all(rt, 100, head)
    with rt.store.reporting_write() as tx:  # age every run past any retention window
        if rt.backend == "sqlite":
            tx.sql().execute("UPDATE steptrail_runs SET created_at = created_at - 3456000000000")
        else:
            tx.sql().execute(
                "UPDATE steptrail_runs SET created_at = created_at - interval '40 days'"
            )
    report = rt.purge()
    assert report.total == 6
    after = read_all(rt, 100, head)
    assert [e.position for e in after] == [e.position for e in before]
    assert all(e.purged and e.event is None and e.purged_at is not None for e in after)
    assert [(e.run_id, e.version) for e in after] == [(e.run_id, e.version) for e in before]
    assert rt.verify("reporting") == []


def test_projection__whose_create_tables_raises_is_recorded_not_fatal(db_url: str) -> None:
    """A projection that cannot even create its tables fails alone, on record."""
    app = cost_app()

    def create(sql: steptrail.Sql) -> None:
        sql.execute("CREATE TABLE nonsense (")

    app.projection("bad_schema", tables=("nonsense",), create_tables=create)(
        lambda event, ctx: None
    )
    rt = make_runtime(db_url, app)
    try:
        scripted_mix(rt)
        done = settle(rt)
        assert done["cost_per_agent_day"] == rt.views.head()
        failure = {t.name: t for t in rt.tracked()}["bad_schema"].failure
        assert failure is not None
        assert failure.position == (0, 0)
        assert "Error" in failure.error.partition(":")[0]
    finally:
        rt.close()


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(commands=COMMANDS)
def test_projection__random_lifecycles_live_equals_rebuild(rt: Runtime, commands: Any) -> None:
    """For random command sequences with the projection's batches interleaved, the live
    tables always equal a rebuild into a scratch copy."""
    store = rt.projection("cost_per_agent_day")
    store.ensure_tables()
    with rt.store.reporting_write() as tx:  # hypothesis reuses the fixture: start empty
        for name in store.projection.tables:
            tx.sql().execute(f"DELETE FROM {name}")
        tx.run("rewind_tracking", {"projection": store.name})
    runs: list[UUID] = []
    for name, pick in commands:
        if name == "project":
            store.process_batch(pick + 1)
        else:
            apply_command(rt.store, runs, name, pick)
    store.catch_up(batch=4)
    assert rt.verify("cost_per_agent_day") == []


def test_feed__payloads_are_the_logs_own_filtered_by_privacy(rt: Runtime) -> None:
    """At the default privacy level the feed carries counts and lengths, never the content
    a step returned, exactly as the log holds it."""
    run_id = rt.enqueue("scripted", {"steps": 2})
    rt.work(burst=True)
    trail = rt.history(run_id)
    entries = read_all(rt, 100, len(trail))
    steps = [e for e in entries if isinstance(e.event, events.StepRecorded)]
    assert [e.event for e in steps] == [
        h.event for h in trail if isinstance(h.event, events.StepRecorded)
    ]
    assert steps
    assert "thought" not in repr([e.event for e in entries])


class StepsPerRun(steptrail.Projection):
    """Per-run rows (content a purge must take away): steps and tokens of each run."""

    tables = ("steps_per_run",)
    topics = (events.StepRecorded.TOPIC,)

    def create_tables(self, sql: steptrail.Sql) -> None:
        sql.execute(
            "CREATE TABLE IF NOT EXISTS steps_per_run ("
            " run_id TEXT PRIMARY KEY, steps INTEGER NOT NULL, tokens INTEGER NOT NULL)"
        )

    def apply(self, event: events.RunEvent, ctx: steptrail.EventContext) -> None:
        assert isinstance(event, events.StepRecorded)
        ctx.sql.execute(
            "INSERT INTO steps_per_run (run_id, steps, tokens) VALUES (:r, 1, :t)"
            " ON CONFLICT (run_id) DO UPDATE SET steps = steps_per_run.steps + 1,"
            " tokens = steps_per_run.tokens + excluded.tokens",
            {"r": str(ctx.run_id), "t": event.tokens},
        )

    def forget(self, run_ids: Any, sql: steptrail.Sql) -> None:
        sql.executemany(
            "DELETE FROM steps_per_run WHERE run_id = :r", [{"r": str(r)} for r in run_ids]
        )


def test_purge__calls_forget_in_its_transaction_and_verify_stays_clean(db_url: str) -> None:
    """A purge removes what a projection keeps of the purged runs (its `forget`), so the
    projection still equals a rebuild from the log; runs not purged keep their rows."""
    app = steptrail.App()
    app.add_projection("steps_per_run", StepsPerRun())
    rt = make_runtime(db_url, app)
    try:
        old = scripted_mix(rt)
        settle(rt)
        stepped = {
            str(r)
            for r in old
            if any(isinstance(h.event, events.StepRecorded) for h in rt.history(r))
        }
        assert {row[0] for row in table(rt, "steps_per_run")} == stepped
        with rt.store.reporting_write() as tx:  # age these runs past the retention window
            if rt.backend == "sqlite":
                tx.sql().execute(
                    "UPDATE steptrail_runs SET created_at = created_at - 3456000000000"
                )
            else:
                tx.sql().execute(
                    "UPDATE steptrail_runs SET created_at = created_at - interval '40 days'"
                )
        young = rt.enqueue("scripted", {"steps": 2})
        rt.work(burst=True)
        settle(rt)
        assert rt.purge().total == len(old)
        assert [row[0] for row in table(rt, "steps_per_run")] == [str(young)]
        assert rt.verify("steps_per_run") == []
    finally:
        rt.close()


def test_wait_for_run__returns_once_the_projection_has_the_run(rt: Runtime) -> None:
    """Waiting for a run returns when a runner has folded its events, and times out while
    none runs."""
    run_id = rt.enqueue("scripted", {"steps": 1})
    store = rt.projection("cost_per_agent_day")
    with pytest.raises(TimeoutError):
        store.wait_for_run(run_id, timeout=0.2)
    runner = threading.Thread(target=lambda: settle(rt))
    runner.start()
    assert store.wait_for_run(run_id, timeout=30) >= (0, 1)
    runner.join()
    with pytest.raises(LookupError):
        store.wait_for_run(uuid4(), timeout=0.1)
