"""Short ids (ADR 0074): every API call that takes a run accepts its id, its text, or at
least 8 hex digits of its start or of its end (what tables show); an ambiguous part is
refused listing the candidates; a part of a purged run's id still says it was purged."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import pytest

from steptrail import runtime_enqueue as runtime_module
from steptrail.domain.errors import AmbiguousRunId, InvalidRunId, UnknownRun
from steptrail.domain.ids import run_reference, short_id
from steptrail.runtime import Runtime

# Ids made to collide: two share their last 8 digits, two their first 20.
SAME_END_A = UUID("01900000-0000-7000-8000-0000aaaa1111")
SAME_END_B = UUID("01900001-0000-7000-8000-0000aaaa1111")
SAME_START_A = UUID("01900002-0000-7000-8000-000000000001")
SAME_START_B = UUID("01900002-0000-7000-8000-000000000002")
LONER = UUID("01900003-0000-7000-8000-00000000beef")


@pytest.fixture
def chosen(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    """The runtime, with five queued runs whose ids are the ones above."""
    ids = iter([SAME_END_A, SAME_END_B, SAME_START_A, SAME_START_B, LONER])
    monkeypatch.setattr(runtime_module, "new_run_id", lambda: next(ids))
    for _ in range(5):
        runtime.enqueue("scripted", {"steps": 1})
    monkeypatch.undo()
    return runtime


def test_short_ids__the_shown_suffix_a_prefix_and_any_spelling_find_the_run(
    runtime: Runtime,
) -> None:
    made = [runtime.enqueue("scripted", {"steps": 1}) for _ in range(3)]
    for run_id in made:
        for given in (
            short_id(run_id),
            short_id(run_id).upper(),
            run_id.hex[-12:],
            run_id.hex[:28],
            str(run_id),
            run_id.hex,
            f"  {str(run_id).upper()}  ",
        ):
            assert runtime.get(given).run_id == run_id, given
        assert runtime.resolve(run_id) is run_id  # a UUID costs no read


def test_short_ids__every_use_case_takes_one(runtime: Runtime) -> None:
    run_id = runtime.enqueue("scripted", {"steps": 1})
    short = short_id(run_id)
    assert [e.event.__class__.__name__ for e in runtime.history(short)] == ["Queued"]
    state, upto = runtime.audit(short, 1)
    assert state.run_id == run_id
    assert len(upto) == 1
    assert runtime.runs(before=short) == []
    assert runtime.cancel(short, by="op").status.value == "cancelled"
    with pytest.raises(Exception, match=r"cancelled|settled|ended"):
        runtime.signal(short, "go", {"x": 1})


def test_short_ids__an_ambiguous_part_lists_the_candidates(chosen: Runtime) -> None:
    with pytest.raises(AmbiguousRunId) as end:
        chosen.get("aaaa1111")
    assert set(end.value.candidates) == {str(SAME_END_A), str(SAME_END_B)}
    with pytest.raises(AmbiguousRunId) as start:
        chosen.get(SAME_START_A.hex[:20])
    assert set(start.value.candidates) == {str(SAME_START_A), str(SAME_START_B)}
    assert str(SAME_START_A) in str(start.value)
    # More of the digits settle it; the other runs are found by their own parts.
    assert chosen.get("01900000").run_id == SAME_END_A
    assert chosen.get(SAME_END_B.hex[:8]).run_id == SAME_END_B
    assert chosen.get("0000beef").run_id == LONER
    assert chosen.get(SAME_START_B.hex[-8:]).run_id == SAME_START_B


def test_short_ids__an_ambiguous_part_shows_at_most_five_and_says_there_are_more(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = iter(UUID(f"0190000{i}-0000-7000-8000-00000000cafe") for i in range(8))
    monkeypatch.setattr(runtime_module, "new_run_id", lambda: next(ids))
    for _ in range(8):
        runtime.enqueue("scripted", {"steps": 1})
    with pytest.raises(AmbiguousRunId) as many:
        runtime.get("0000cafe")
    assert len(many.value.candidates) == 6
    assert many.value.candidates[-1] == "…"


def test_short_ids__unknown_too_short_and_not_hex_are_refused(chosen: Runtime) -> None:
    with pytest.raises(UnknownRun, match="12345678"):
        chosen.get("12345678")
    for bad in ("aaaa111", "", "zzzzzzzz", "g" * 32, "0" * 33, "aaaa 1111"):
        with pytest.raises(InvalidRunId):
            chosen.get(bad)
    with pytest.raises(InvalidRunId, match="at least 8"):
        run_reference("abc")
    with pytest.raises(TypeError):
        chosen.resolve(12345678)  # type: ignore[arg-type]


def test_short_ids__a_purged_run_is_named_as_purged(runtime: Runtime) -> None:
    from tests.integration.test_retention import age

    run_id = runtime.enqueue("scripted", {"steps": 1})
    age(runtime, [run_id], days=3)
    assert runtime.purge(days=2).total == 1
    with pytest.raises(UnknownRun, match="purged"):
        runtime.get(short_id(run_id))
