"""The command line imports what a command needs when it needs it (ADRs 0043, 0051).

Each check runs in a fresh interpreter and lists which of the heavy modules ended up in
`sys.modules`: an eager import anywhere on the path (the package's `__init__`, the CLI
modules, `render`) brings one of them back and fails the test. Speed itself is measured by
bench/cli_start.py, never asserted here.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from uuid import uuid4

import pytest

# What `--help` must not pay for: the runtime and the stores, PostgreSQL's driver, the event
# sourcing library, logging, schema validation, the run model, settings, integrations.
HEAVY = (
    "steptrail.runtime",
    "steptrail.async_runtime",
    "steptrail.infrastructure.factory",
    "steptrail.infrastructure.sqlite",
    "steptrail.infrastructure.postgres",
    "steptrail.infrastructure.settings",
    "steptrail.infrastructure.feed",
    "steptrail.domain.run",
    "steptrail.workers.execute",
    "steptrail.projections.custom",
    "psycopg",
    "psycopg_pool",
    "eventsourcing",
    "structlog",
    "jsonschema",
    "pydantic_settings",
    "pydantic_ai",
    "opentelemetry",
    "prometheus_client",
    "starlette",
)

# Runs `steptrail ARGV` (argv as JSON in sys.argv[1]) as the program does (`main()`); the last
# line of the output is the list of watched modules then loaded, and the exit code.
PROBE = """
import json, sys
sys.argv = ["steptrail", *json.loads(sys.argv[1])]
from steptrail.cli import main
code = 0
try:
    main()
except SystemExit as exit:
    code = exit.code
"""


def report(watch: Sequence[str]) -> str:
    """Code printing the watched modules (and their submodules) loaded by then, as JSON."""
    return (
        f"\nwatch = {list(watch)!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m in watch "
        "or any(m.startswith(w + '.') for w in watch))))"
    )


def loaded_after(
    code: str, *args: str, watch: Sequence[str] = HEAVY, env: dict[str, str] | None = None
) -> list[str]:
    """The watched modules (and their submodules) loaded after running `code`."""
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys\n" + code + report(watch), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def cli_loads(*argv: str, watch: Sequence[str] = HEAVY, **env: str) -> list[str]:
    return loaded_after(
        PROBE + "assert code in (0, None), code\n", json.dumps(list(argv)), watch=watch, env=env
    )


def test_the_probe_sees_an_eager_import() -> None:
    """The check is real: importing the runtime and the worker loop does load the heavy
    modules."""
    loaded = loaded_after("import steptrail.runtime\nimport steptrail.workers.worker")
    assert "steptrail.runtime" in loaded
    assert "structlog" in loaded


def test_plain_help_imports_none_of_the_heavy_modules() -> None:
    assert cli_loads("--help") == []


def test_stats_help_imports_none_of_the_heavy_modules() -> None:
    assert cli_loads("stats", "--help") == []


def command_names() -> list[str]:
    from steptrail.cli import cli

    names = [c.name or (c.callback.__name__ if c.callback else "") for c in cli.registered_commands]
    return sorted(n.replace("_", "-") for n in names if n)


@pytest.mark.parametrize("command", command_names())
def test_every_commands_help_imports_none_of_the_heavy_modules(command: str) -> None:
    assert cli_loads(command, "--help") == []


def test_importing_the_package_imports_nothing_heavy() -> None:
    assert loaded_after("import steptrail") == []


def test_every_exported_name_still_resolves() -> None:
    import steptrail

    for name in steptrail.__all__:
        assert getattr(steptrail, name) is not None, name
    from steptrail import InvalidItem, Runtime, open

    assert open is steptrail.open_runtime
    from steptrail.runtime import InvalidItem as from_runtime  # where it always was

    assert InvalidItem is from_runtime
    assert Runtime.__name__ == "Runtime"
    assert set(steptrail.__all__) <= set(dir(steptrail))


def test_an_unknown_name_is_an_attribute_error() -> None:
    import steptrail

    with pytest.raises(AttributeError, match="no_such_name"):
        steptrail.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        from steptrail import no_such_name  # type: ignore[attr-defined]  # noqa: F401


def test_a_command_on_sqlite_does_not_import_the_postgresql_driver(
    small_db: tuple[str, str],
) -> None:
    """`stats` on a SQLite database opens the runtime (the probe sees it) but never psycopg
    or the PostgreSQL store (imported when a PostgreSQL URL is opened), nor jsonschema
    (imported when an input schema is checked)."""
    url = small_db[0]
    loaded = cli_loads("--database-url", url, "stats")
    assert "steptrail.runtime" in loaded
    assert [m for m in loaded if m.split(".")[0] == "psycopg"] == []
    assert "steptrail.infrastructure.postgres" not in loaded
    assert [m for m in loaded if m.split(".")[0] == "jsonschema"] == []


# -- commands that open a database (ADR 0051) ------------------------------------------------

# What executing runs needs and a command that does not execute runs must not pay for: the
# executor, the worker loop, segments and their contexts, leases, decisions, retention,
# maintenance, the projection runner.
WORKER_MACHINERY = (
    "steptrail.workers.execute",
    "steptrail.workers.worker",
    "steptrail.workers.segment",
    "steptrail.workers.context",
    "steptrail.workers.async_context",
    "steptrail.workers.lease",
    "steptrail.workers.decisions",
    "steptrail.workers.retention",
    "steptrail.workers.maintenance",
    "steptrail.workers.projector",
)
# Neither does a command on SQLite need the worker metrics (prometheus_client), PostgreSQL's
# driver, schema validation or the integrations.
NOT_FOR_A_SQLITE_COMMAND = (
    *WORKER_MACHINERY,
    "prometheus_client",
    "steptrail.worker_metrics",
    "psycopg",
    "psycopg_pool",
    "steptrail.infrastructure.postgres",
    "jsonschema",
    "pydantic_ai",
    "starlette",
)
# A read command creates no run (so traces nothing) and logs nothing at the default level.
NOT_FOR_A_READ = (
    *NOT_FOR_A_SQLITE_COMMAND,
    "steptrail.tracing",
    "opentelemetry.trace",
    "structlog",
    "steptrail.workers.reaper",
)


@pytest.fixture(scope="module")
def small_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A SQLite database with one finished two-step run: its URL and the run's id."""
    url = f"sqlite:///{tmp_path_factory.mktemp('start') / 'small.db'}"
    return url, _one_finished_run(url)


def _one_finished_run(url: str) -> str:
    """Run one two-step run to its end on `url`; its id."""
    from tests.conftest import make_runtime

    rt = make_runtime(url)
    try:
        run_id = rt.enqueue("scripted", {"steps": 2})
        rt.work(burst=True)
        assert rt.get(run_id).status.value == "completed"
    finally:
        rt.close()
    return str(run_id)


@pytest.mark.parametrize(
    "argv",
    [
        ["stats"],
        ["stats", "--json"],
        ["runs"],
        ["show", "{run}"],
        ["audit", "{run}", "--at", "2"],
        ["dead-letters"],
        ["events"],
    ],
    ids=" ".join,
)
def test_a_read_command_on_sqlite_imports_only_what_reading_needs(
    small_db: tuple[str, str], argv: list[str]
) -> None:
    """A read command opens the runtime (the probe sees it) and reads the views and the log,
    but imports none of the worker machinery, structlog, the worker metrics, the tracer,
    psycopg or jsonschema."""
    url, run_id = small_db
    args = [a.format(run=run_id) for a in argv]
    loaded = cli_loads("--database-url", url, *args, watch=("steptrail.runtime", *NOT_FOR_A_READ))
    assert loaded == ["steptrail.runtime"]


def test_enqueue_on_sqlite_imports_no_worker_machinery_nor_metrics(
    small_db: tuple[str, str],
) -> None:
    """`enqueue` writes a run (and traces its creation: OpenTelemetry is installed here): it
    imports neither what executes runs nor prometheus_client; below the log level its
    `run_enqueued` event does not import structlog either."""
    url, _ = small_db
    watch = ("steptrail.runtime", "steptrail.tracing", *NOT_FOR_A_SQLITE_COMMAND, "structlog")
    quiet = cli_loads(
        "--database-url", url, "enqueue", "scripted", watch=watch, STEPTRAIL_LOG_LEVEL="warning"
    )
    assert "steptrail.tracing" in quiet  # the run's creation is traced
    assert [m for m in quiet if "tracing" not in m] == ["steptrail.runtime"]
    logged = cli_loads(
        "--database-url", url, "enqueue", "scripted", watch=watch, STEPTRAIL_LOG_LEVEL="info"
    )
    assert "structlog" in logged  # the event is written: structlog renders it
    assert [m for m in logged if m.split(".")[0] != "structlog" and "tracing" not in m] == [
        "steptrail.runtime"
    ]


def test_reap_imports_the_reaper_but_not_what_executes_runs(small_db: tuple[str, str]) -> None:
    url, _ = small_db
    watch = ("steptrail.workers.reaper", *NOT_FOR_A_SQLITE_COMMAND)
    assert cli_loads("--database-url", url, "reap", watch=watch) == ["steptrail.workers.reaper"]


def test_the_worker_still_gets_its_machinery_metrics_and_logs(small_db: tuple[str, str]) -> None:
    """The modules a read command leaves out are there when runs are executed: the check
    above is not blind to them."""
    url, _ = small_db
    loaded = cli_loads(
        "--database-url",
        url,
        "work",
        "--burst",
        watch=("steptrail.workers.execute", "steptrail.workers.worker", "prometheus_client"),
    )
    assert {"steptrail.workers.execute", "steptrail.workers.worker", "prometheus_client"} <= set(
        loaded
    )


# -- commands on PostgreSQL (ADR 0056) -----------------------------------------------------------

# What a PostgreSQL command needs besides what a SQLite one does is psycopg: not the SQLite
# store (sqlite3 and the eventsourcing library, which the SQLite store is built on), and a
# command that ends when its work is done keeps one connection instead of opening a pool.
NOT_FOR_A_PG_COMMAND = (
    "steptrail.infrastructure.sqlite",
    "sqlite3",
    "eventsourcing",
    "psycopg_pool",
    *WORKER_MACHINERY,
    "prometheus_client",
    "jsonschema",
)


@pytest.fixture(scope="module")
def small_pg_db(pg_database: str) -> tuple[str, str]:
    """The session's PostgreSQL database with one finished two-step run: its URL and the
    run's id."""
    return pg_database, _one_finished_run(pg_database)


@pytest.mark.parametrize(
    "argv",
    [["stats"], ["runs"], ["runs", "--agent", "scripted"], ["show", "{run}"], ["events"]],
    ids=" ".join,
)
def test_a_read_command_on_postgresql_imports_psycopg_but_no_pool_nor_sqlite(
    small_pg_db: tuple[str, str], argv: list[str]
) -> None:
    """A read command on PostgreSQL imports psycopg and the PostgreSQL store, and nothing of
    the SQLite store, the connection pool, the worker machinery, structlog or the tracer."""
    url, run_id = small_pg_db
    args = [a.format(run=run_id) for a in argv]
    watch = ("psycopg", "steptrail.infrastructure.postgres", *NOT_FOR_A_PG_COMMAND, "structlog")
    loaded = cli_loads("--database-url", url, *args, watch=(*watch, "steptrail.tracing"))
    assert "steptrail.infrastructure.postgres" in loaded
    assert "psycopg" in loaded
    assert [m for m in loaded if m.split(".")[0] != "psycopg"] == [
        "steptrail.infrastructure.postgres"
    ]


@pytest.mark.parametrize("argv", [["enqueue", "scripted"], ["reap"]], ids=" ".join)
def test_a_write_command_on_postgresql_opens_no_pool_nor_the_sqlite_store(
    small_pg_db: tuple[str, str], argv: list[str]
) -> None:
    url, _ = small_pg_db
    loaded = cli_loads("--database-url", url, *argv, watch=NOT_FOR_A_PG_COMMAND)
    assert loaded == []


def test_a_worker_on_postgresql_still_gets_its_pool(small_pg_db: tuple[str, str]) -> None:
    """`work` runs until stopped and gets the pool: the checks above are not blind to it."""
    url, _ = small_pg_db
    loaded = cli_loads("--database-url", url, "work", "--burst", watch=NOT_FOR_A_PG_COMMAND)
    assert "psycopg_pool" in loaded
    assert "steptrail.workers.worker" in loaded
    assert "eventsourcing" not in loaded
    assert "steptrail.infrastructure.sqlite" not in loaded


# -- the lazy pieces behave as the eager ones did ------------------------------------------------


def test_the_lazy_logger_drops_below_the_level_without_structlog_and_keeps_bound_values() -> None:
    """Below the `steptrail` logger's level nothing is built; a bound value reaches the record
    once an event passes, exactly as structlog's own logger delivers it."""
    code = """
import logging
from steptrail.infrastructure.logging import steptrail_logger
logging.getLogger("steptrail").setLevel(logging.WARNING)
log = steptrail_logger().bind(worker_id="w")
log.info("run_enqueued", run_id="r")
log.debug("nothing")
"""
    assert loaded_after(code, watch=("structlog",)) == []
    code += 'log.warning("lease_lost", run_id="r")\n'
    assert "structlog" in loaded_after(code, watch=("structlog",))


def test_the_lazy_logger_delivers_the_same_records_as_structlog(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from steptrail.infrastructure.logging import _structlog_logger, steptrail_logger

    logger = logging.getLogger("steptrail")
    old = logger.level, logger.propagate
    logger.propagate = True
    try:
        logger.setLevel(logging.INFO)
        with caplog.at_level(logging.INFO, logger="steptrail"):
            steptrail_logger().bind(worker_id="w").bind(run_id="r").info("a", version=2)
            _structlog_logger().bind(worker_id="w").bind(run_id="r").info("a", version=2)
            steptrail_logger().debug("below")
        events = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
        # Both loggers delivered (two timestamps), the same event dictionary, and no `below`.
        assert len({e["timestamp"] for e in events}) == 2
        assert [{k: v for k, v in e.items() if k != "timestamp"} for e in events] == [
            {"worker_id": "w", "run_id": "r", "version": 2, "event": "a", "level": "info"}
        ] * len(events)
    finally:
        logger.setLevel(old[0])
        logger.propagate = old[1]


def test_the_cli_log_handler_writes_json_lines_as_before() -> None:
    """`configure_logging("json")`: one JSON object per event on stderr, with the event, its
    level, an ISO timestamp and the bound keys (structlog is built at the first record)."""
    code = """
import sys
from steptrail.infrastructure.logging import configure_logging, steptrail_logger
configure_logging("json", "info")
steptrail_logger().bind(run_id="r").info("run_enqueued", version=1)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    (line,) = done.stderr.strip().splitlines()
    record = json.loads(line)
    assert {k: v for k, v in record.items() if k != "timestamp"} == {
        "event": "run_enqueued",
        "level": "info",
        "run_id": "r",
        "version": 1,
    }
    assert record["timestamp"].endswith("Z")


def test_deferred_hooks_name_every_hook_the_made_observer_overrides() -> None:
    """The runtime makes its private worker metrics and its global-provider tracer on their
    first hook, and calls only the hooks it was told they override: the lists must be
    exactly what those classes override, or an event would be lost."""
    from steptrail.runtime import METRICS_HOOKS, TRACING_HOOKS
    from steptrail.tracing import Tracing
    from steptrail.worker_metrics import WorkerMetrics
    from steptrail.workers.telemetry import Telemetry

    hooks = ("run_created", "claimed", "segment_started")

    def overridden(cls: type[Telemetry]) -> set[str]:
        return {h for h in hooks if getattr(cls, h) is not getattr(Telemetry, h)}

    assert overridden(WorkerMetrics) == set(METRICS_HOOKS)
    assert overridden(Tracing) == set(TRACING_HOOKS)


def test_a_deferred_observer_is_made_once_on_its_first_hook() -> None:
    from steptrail.domain.run import Run
    from steptrail.workers.telemetry import NO_CREATION, NO_SEGMENT, Deferred, Telemetry

    made: list[Telemetry] = []
    heard: list[str] = []

    class Observer(Telemetry):
        def segment_started(self, run: Run) -> object:  # type: ignore[override]
            heard.append(str(run.id))
            return NO_SEGMENT

    def make() -> Observer:
        made.append(Observer())
        return made[-1]  # type: ignore[return-value]

    deferred = Deferred(make, ["segment_started"])
    assert deferred.run_created(agent="a", run_id=uuid4(), how="enqueue") is NO_CREATION
    deferred.claimed([], 0.1)
    assert made == []  # hooks it does not override never make it
    run = Run.enqueue(run_id=uuid4(), agent="a", request_digest="d", actor="t")
    deferred.segment_started(run)
    deferred.segment_started(run)
    assert len(made) == 1
    assert deferred.made() is made[0]
    assert heard == [str(run.id)] * 2
    with pytest.raises(ValueError, match="not telemetry hooks"):
        Deferred(make, ["segment_started", "run_started"])


def test_preparing_the_observers_makes_the_deferred_ones_and_their_imports_now(
    tmp_path: Path,
) -> None:
    """`work` makes its metrics and its tracer before it arms its signal handlers, so that no
    SIGTERM lands inside their first-use imports (a broken module lock exited the worker 1):
    a runtime opened without them has neither module, and has both once prepared."""
    url = f"sqlite:///{tmp_path / 'prepared.db'}"
    code = (
        "from steptrail import open_runtime\n"
        f"rt = open_runtime(url={url!r})\n"
        "watched = ('prometheus_client', 'steptrail.tracing')\n"
        "before = sorted(m for m in watched if m in sys.modules)\n"
        "rt.prepare_observers()\n"
        "print(json.dumps(before))\n"
        "rt.close()\n"
    )
    watch = ("prometheus_client", "steptrail.tracing")
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys\n" + code + report(watch)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "STEPTRAIL_TRACING": "auto"},
    )
    before, after = done.stdout.strip().splitlines()[-2:]
    assert json.loads(before) == []
    assert {"prometheus_client", "steptrail.tracing"} <= set(json.loads(after))


def test_building_a_worker_makes_its_observers_before_its_first_claim(tmp_path: Path) -> None:
    """`Runtime.worker()` makes the metrics and the tracer when it builds the worker (ADR
    0091): their imports are not paid at its first claim, between the claim and the start
    of the runs it took. Opening the runtime alone still makes neither."""
    url = f"sqlite:///{tmp_path / 'built.db'}"
    code = (
        "from steptrail import open_runtime\n"
        f"rt = open_runtime(url={url!r})\n"
        "watched = ('prometheus_client', 'steptrail.tracing')\n"
        "before = sorted(m for m in watched if m in sys.modules)\n"
        "worker = rt.worker(concurrency=2, burst=True)\n"
        "print(json.dumps(before))\n"
    )
    watch = ("prometheus_client", "steptrail.tracing")
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys\n" + code + report(watch) + "\nrt.close()"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "STEPTRAIL_TRACING": "auto"},
    )
    before, after = done.stdout.strip().splitlines()[-2:]
    assert json.loads(before) == []
    assert {"prometheus_client", "steptrail.tracing"} <= set(json.loads(after))


def test_preparing_a_fanout_prepares_each_member_once() -> None:
    from steptrail.workers.telemetry import Deferred, Telemetry, compose

    made: list[str] = []

    def maker(name: str) -> Telemetry:
        made.append(name)
        return Telemetry()

    first = Deferred(lambda: maker("first"), ["claimed"])
    second = Deferred(lambda: maker("second"), ["segment_started"])
    observers = compose(first, second, Telemetry())
    observers.prepare()
    observers.prepare()
    assert made == ["first", "second"]


def test_a_runtimes_metrics_are_one_object_made_when_asked(tmp_path: Path) -> None:
    from steptrail.worker_metrics import WorkerMetrics
    from tests.conftest import make_runtime

    rt = make_runtime(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        assert isinstance(rt.metrics, WorkerMetrics)
        assert rt.metrics is rt.metrics
    finally:
        rt.close()


# -- garbage collection while the program starts ---------------------------------------------


def test_the_program_collects_garbage_again_once_the_runtime_is_open(
    small_db: tuple[str, str],
) -> None:
    """`python -m steptrail` pauses automatic collection while it imports; by the time the
    command works with its runtime, collection is back on (and what the start built is
    frozen), so a long command (`work`, `console`) collects as any program does."""
    url, _ = small_db
    code = (
        """
import gc
from steptrail import _startup
_startup.pause()
paused = not gc.isenabled()
import steptrail.runtime as runtime
seen = []
close = runtime.Runtime.close
def recording_close(self):
    seen.append((gc.isenabled(), gc.get_freeze_count() > 0))
    close(self)
runtime.Runtime.close = recording_close
"""
        + PROBE
        + "print('OUT', paused, seen, gc.isenabled())\n"
    )
    argv = json.dumps(["--database-url", url, "runs"])
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys\n" + code, argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("OUT ")]
    assert line == "OUT True [(True, True)] True"


def test_importing_or_running_the_cli_in_a_host_leaves_its_collector_alone() -> None:
    """Only the program pauses: resuming without a pause, or a host that imports the CLI,
    never freezes or switches the host's collector."""
    from steptrail import _startup

    frozen = gc.get_freeze_count()
    assert gc.isenabled()
    _startup.resume()
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
    gc.disable()
    try:
        _startup.pause()  # already off: not ours to turn back on
        _startup.resume()
        assert not gc.isenabled()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.enable()
