"""The command line imports what a command needs when it needs it (ADR 0043).

Each check runs in a fresh interpreter and lists which of the heavy modules ended up in
`sys.modules`: an eager import anywhere on the path (the package's `__init__`, the CLI
modules, `render`) brings one of them back and fails the test. Speed itself is measured by
bench/cli_start.py, never asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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

# Runs `steptrail ARGV` (argv as JSON in sys.argv[1]); `main()` prints the help first, so the
# last line of the output is the list of heavy modules then loaded.
PROBE = """
import json, sys
sys.argv = ["steptrail", *json.loads(sys.argv[1])]
from steptrail.cli import main
try:
    main()
except SystemExit:
    pass
"""
REPORT = (
    f"\nheavy = {list(HEAVY)!r}\n"
    "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy)))"
)


def loaded_after(code: str, *args: str) -> list[str]:
    """The heavy modules (and their submodules) loaded after running `code`."""
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys\n" + code + REPORT, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def cli_loads(*argv: str) -> list[str]:
    return loaded_after(PROBE, json.dumps(list(argv)))


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
    assert InvalidItem.__module__ == "steptrail.runtime"
    assert Runtime.__name__ == "Runtime"
    assert set(steptrail.__all__) <= set(dir(steptrail))


def test_an_unknown_name_is_an_attribute_error() -> None:
    import steptrail

    with pytest.raises(AttributeError, match="no_such_name"):
        steptrail.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        from steptrail import no_such_name  # type: ignore[attr-defined]  # noqa: F401


def test_a_command_on_sqlite_does_not_import_the_postgresql_driver(tmp_path: Path) -> None:
    """`stats` on a SQLite database opens the runtime (the probe sees it) but never psycopg
    or the PostgreSQL store (imported when a PostgreSQL URL is opened), nor jsonschema
    (imported when an input schema is checked)."""
    url = f"sqlite:///{tmp_path / 'small.db'}"
    loaded = cli_loads("--database-url", url, "stats")
    assert "steptrail.runtime" in loaded
    assert [m for m in loaded if m.split(".")[0] == "psycopg"] == []
    assert "steptrail.infrastructure.postgres" not in loaded
    assert [m for m in loaded if m.split(".")[0] == "jsonschema"] == []
