"""The step journal's stored form: a scalar result's fast encoding is byte for byte the
general one, and every JSON value survives the SQLite column's packing (ADR 0050)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from steptrail.domain.journal import _ENCODER, JournalEntry, StepCall
from steptrail.infrastructure.sqlite import journal_cells, journal_from_cells
from tests.unit.test_run import running

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
CALL = StepCall("llm", "n", "0" * 16)


@given(scalars)
def test_of_value__a_scalar_encodes_as_the_general_form(value: Any) -> None:
    assert JournalEntry.of_value(1, CALL, value).outcome() == (
        _ENCODER.encode({"value": value}).encode()
    )


@given(st.sampled_from([float("inf"), float("-inf"), float("nan")]))
def test_of_value__a_non_json_float_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="JSON"):
        JournalEntry.of_value(1, CALL, value)


@given(values, st.text(), st.sampled_from(["llm", "tool", "step", "decision"]))
def test_journal_cell__every_value_and_name_round_trips(value: Any, name: str, kind: str) -> None:
    """What `SqliteStore.append` writes in the event row is read back as the same entry."""
    run = running()
    entry = JournalEntry.of_value(1, StepCall(kind, name, "0" * 16), value)
    run.record_step(kind=kind, name=name, duration_ms=0, journal=entry)
    cells = journal_cells(run)
    (back,) = journal_from_cells(cells.values())
    assert (back.seq, back.position, back.kind, back.name) == (1, 1, kind, name)
    assert json.dumps(back.value, sort_keys=True) == json.dumps(value, sort_keys=True)
