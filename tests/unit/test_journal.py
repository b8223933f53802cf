"""The step journal's pure rules: positions, matching, trailing failures, the stored form."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from steptrail.domain.classifier import classify
from steptrail.domain.enums import FailureClass
from steptrail.domain.journal import (
    JournalCursor,
    JournalEntry,
    NonDeterministic,
    ReplayedError,
    StepCall,
    fingerprint,
)


def entry(
    seq: int, name: str, *, position: int | None = None, value: object = None
) -> JournalEntry:
    return JournalEntry(seq, position or seq, "llm", name, fingerprint({"n": name}), value=value)


def failed(seq: int, name: str, *, position: int | None = None) -> JournalEntry:
    return JournalEntry(
        seq,
        position or seq,
        "llm",
        name,
        fingerprint({"n": name}),
        error_type="HttpStatusError",
        error_message="HTTP 503",
        failure_class=FailureClass.SERVER_ERROR,
    )


def call(name: str, kind: str = "llm") -> StepCall:
    return StepCall(kind, name, fingerprint({"n": name}))


def test_cursor__hands_back_recorded_values_by_position_then_goes_live() -> None:
    """Positions 1..n answer from the journal in order; position n+1 runs for real."""
    cursor = JournalCursor([entry(2, "b", value=2), entry(1, "a", value=1)])
    assert cursor.next(call("a")).value == 1  # type: ignore[union-attr]
    assert cursor.next(call("b")).value == 2  # type: ignore[union-attr]
    assert cursor.next(call("c")) is None
    assert (cursor.replayed, cursor.last_seq, cursor.position, cursor.live) == (2, 2, 3, True)


def test_cursor__mismatch_names_position_expected_and_found() -> None:
    """Another step at a recorded position raises NonDeterministic naming all three."""
    cursor = JournalCursor([entry(1, "a"), entry(2, "b")])
    cursor.next(call("a"))
    with pytest.raises(NonDeterministic) as caught:
        cursor.next(call("b", kind="tool"))
    message = str(caught.value)
    assert "step 2" in message
    assert "llm 'b'" in message
    assert "tool 'b'" in message
    assert classify(caught.value) is FailureClass.NON_DETERMINISTIC


def test_cursor__changed_arguments_are_a_mismatch() -> None:
    """Same kind and name with other declared arguments does not match."""
    cursor = JournalCursor([entry(1, "a")])
    with pytest.raises(NonDeterministic):
        cursor.next(StepCall("llm", "a", fingerprint({"n": "other"})))


def test_cursor__divergence_is_sticky() -> None:
    """After a mismatch every further call raises, even one past the journal's end."""
    cursor = JournalCursor([entry(1, "a")])
    with pytest.raises(NonDeterministic):
        cursor.next(call("x"))
    with pytest.raises(NonDeterministic):
        cursor.next(call("y"))
    assert cursor.diverged is not None


def test_cursor__trailing_failure_runs_again() -> None:
    """A failure that ended its segment is not replayed: that step runs on the retry."""
    cursor = JournalCursor([entry(1, "a"), failed(2, "b")])
    assert cursor.recorded == 1
    cursor.next(call("a"))
    assert cursor.next(call("b")) is None


def test_cursor__trailing_failure_before_a_wait_is_replayed() -> None:
    """A trailing failure the agent caught before a wait (the run was woken from a wait at
    a later step seq) is replayed, so the wait's outcome is found at its seq; one at or
    after the wait's seq (a later segment's) still runs again."""
    entries = [entry(1, "a"), failed(2, "b")]
    assert JournalCursor(entries, waited_at=3).recorded == 2
    assert JournalCursor(entries, waited_at=2).recorded == 1
    assert JournalCursor(entries, waited_at=None).recorded == 1


def test_cursor__caught_failure_is_replayed_as_its_error() -> None:
    """A failure the agent went on from is replayed: the recorded error is raised again."""
    cursor = JournalCursor([failed(1, "a"), entry(2, "b")])
    recorded = cursor.next(call("a"))
    assert recorded is not None
    assert recorded.failed
    error = ReplayedError(recorded)
    assert error.error_type == "HttpStatusError"
    assert error.original_message == "HTTP 503"
    assert classify(error) is FailureClass.SERVER_ERROR


def test_cursor__re_executed_position_supersedes_what_followed() -> None:
    """An entry for an earlier position (a later segment ran that step again) replaces it
    and drops the entries recorded after it."""
    entries = [entry(1, "a"), failed(2, "b"), entry(3, "b2", position=2), entry(4, "c", position=3)]
    cursor = JournalCursor(entries)
    assert cursor.recorded == 3
    cursor.next(call("a"))
    assert cursor.next(call("b2")).seq == 3  # type: ignore[union-attr]
    assert cursor.next(call("c")).seq == 4  # type: ignore[union-attr]


def test_cursor__gap_in_positions_stops_replay_there() -> None:
    """Only a contiguous prefix of positions can be replayed."""
    cursor = JournalCursor([entry(1, "a"), entry(3, "c")])
    assert cursor.recorded == 1


def test_cursor__go_live_numbers_on_from_the_recorded_steps() -> None:
    """An agent resuming by hand replays nothing; its calls number on from `position`."""
    cursor = JournalCursor([entry(1, "a")])
    assert cursor.untouched
    cursor.go_live(5)
    assert cursor.next(call("x")) is None
    assert cursor.position == 6
    assert cursor.replayed == 0


@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda children: st.lists(children) | st.dictionaries(st.text(), children),
        max_leaves=10,
    )
)
def test_entry__value_round_trips_through_its_stored_form(value: object) -> None:
    """A journaled JSON value reads back equal from the stored outcome."""
    stored = entry(1, "a", value=value)
    back = JournalEntry.from_row(
        seq=1,
        position=1,
        kind="llm",
        name="a",
        fingerprint=stored.fingerprint,
        outcome=stored.outcome(),
    )
    assert back == stored


def test_entry__error_round_trips_with_class_and_message() -> None:
    """A journaled error keeps its class name, message and failure class."""
    stored = failed(3, "b")
    back = JournalEntry.from_row(
        seq=3,
        position=3,
        kind="llm",
        name="b",
        fingerprint=stored.fingerprint,
        outcome=stored.outcome(),
    )
    assert back == stored


def test_fingerprint__key_order_does_not_matter() -> None:
    """Arguments are fingerprinted in canonical form."""
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
