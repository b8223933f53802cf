"""The testing kit's pieces without a database: the plugin's registration, fault plans, the
replay-only cursor."""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from steptrail.domain.enums import FailureClass
from steptrail.domain.journal import JournalEntry, StepCall, fingerprint
from steptrail.testing import crash_at, fail_at, lose_lease_at, pgclock
from steptrail.testing.faults import FaultPlan
from steptrail.testing.replay import ReplayEnded, ReplayOnlyCursor

CLOCK_CALLS = (
    r"\b(now|clock_timestamp|statement_timestamp|transaction_timestamp)\s*\(\)"
    r"|\b(current_timestamp|localtimestamp)\b"
)


def test_plugin__registered_as_a_pytest11_entry_point() -> None:
    """pytest loads the kit's fixtures from the installed package, with no configuration."""
    found = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert found.get("steptrail") == "steptrail.testing.plugin"


def test_plugin__loaded_in_this_session(request: pytest.FixtureRequest) -> None:
    """The project's own session runs with the plugin loaded (beside tests/conftest.py)."""
    plugin = request.config.pluginmanager.get_plugin("steptrail")
    assert plugin is not None
    assert plugin.__name__ == "steptrail.testing.plugin"


def test_fault_plan__each_fault_fires_once_at_its_position() -> None:
    """A fault is taken at its position only, and only the first time."""
    plan = FaultPlan([crash_at(2), fail_at(3, "server_error")], store=None)  # type: ignore[arg-type]
    assert plan.take(1) is None
    assert plan.take(2) == crash_at(2)
    assert plan.take(2) is None
    fault = plan.take(3)
    assert fault is not None
    assert fault.failure_class is FailureClass.SERVER_ERROR
    assert [f.kind for f in plan.fired] == ["crash", "fail"]


def test_faults__steps_are_numbered_from_one() -> None:
    """Position 0 does not exist; asking for it is a mistake, said at once."""
    with pytest.raises(ValueError, match="from 1"):
        lose_lease_at(0)


def test_replay_only_cursor__answers_the_journal_then_stops() -> None:
    """Recorded positions replay; the first call beyond them raises ReplayEnded, never None."""
    call = StepCall("llm", "draft", fingerprint(None))
    cursor = ReplayOnlyCursor([JournalEntry.of_value(1, call, "text", seq=1)])
    entry = cursor.next(call)
    assert entry is not None
    assert entry.value == "text"
    with pytest.raises(ReplayEnded):
        cursor.next(StepCall("tool", "send", fingerprint({})))


def test_pgclock__overrides_every_clock_function_the_sql_reads() -> None:
    """Each server clock function in the PostgreSQL SQL is one the kit's clock replaces, so a
    new statement cannot silently escape time skipping."""
    sql_dir = Path(__file__).resolve().parents[2] / "infrastructure" / "sql" / "postgres"
    code = "\n".join(
        "\n".join(line.split("--")[0] for line in f.read_text().splitlines())
        for f in sql_dir.rglob("*.sql")
    )
    used = {m.group(1) or m.group(2) for m in re.finditer(CLOCK_CALLS, code, re.I)}
    assert used, "the SQL reads no clock at all? the pattern is wrong"
    assert "pg_catalog.now" not in code.lower()
    overridden = set(re.findall(rf"{pgclock.SCHEMA}\.(\w+)\(\)", pgclock.INSTALL))
    assert {u.lower() for u in used} <= overridden
