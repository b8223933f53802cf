"""Run ids sort by the millisecond they were made (ADR 0052), in every form a store keeps."""

from __future__ import annotations

import itertools
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from steptrail.domain.ids import ENTROPY_BYTES, short_id, time_ordered_id
from steptrail.runtime import new_run_id

MS = st.integers(min_value=0, max_value=(1 << 48) - 1)
ENTROPY = st.binary(min_size=ENTROPY_BYTES, max_size=ENTROPY_BYTES)


@given(MS, ENTROPY)
def test_time_ordered_id__is_an_rfc_version_7_uuid_of_its_millisecond(ms: int, raw: bytes) -> None:
    run_id = time_ordered_id(ms, raw)
    assert run_id.version == 7
    assert run_id.variant == "specified in RFC 4122"
    assert run_id.int >> 80 == ms
    assert UUID(run_id.hex) == run_id == UUID(str(run_id))


@given(MS, ENTROPY, MS, ENTROPY)
def test_time_ordered_id__sorts_by_millisecond_as_uuid_text_and_bytes(
    ms_a: int, raw_a: bytes, ms_b: int, raw_b: bytes
) -> None:
    """SQLite keys runs by the hex text, PostgreSQL by the uuid's bytes: both orders put an
    earlier millisecond first, whatever the random part."""
    a, b = time_ordered_id(ms_a, raw_a), time_ordered_id(ms_b, raw_b)
    if ms_a < ms_b:
        assert a < b
        assert a.hex < b.hex
        assert a.bytes < b.bytes


@given(MS, ENTROPY, ENTROPY)
def test_time_ordered_id__keeps_74_random_bits(ms: int, raw_a: bytes, raw_b: bytes) -> None:
    """Two ids of one millisecond differ exactly where their random bytes differ outside the
    six bits the version and the variant take."""
    kept = ((1 << 80) - 1) & ~(0xF << 76) & ~(0x3 << 62)
    a, b = time_ordered_id(ms, raw_a), time_ordered_id(ms, raw_b)
    differ = (int.from_bytes(raw_a, "big") ^ int.from_bytes(raw_b, "big")) & kept
    assert (a.int ^ b.int) == differ


@pytest.mark.parametrize(
    ("ms", "raw"),
    [(-1, bytes(ENTROPY_BYTES)), (1 << 48, bytes(ENTROPY_BYTES)), (0, bytes(ENTROPY_BYTES - 1))],
)
def test_time_ordered_id__refuses_what_does_not_fit(ms: int, raw: bytes) -> None:
    with pytest.raises(ValueError, match=r"run id needs|48 bits"):
        time_ordered_id(ms, raw)


def test_new_run_id__later_runs_sort_after_earlier_ones() -> None:
    """Ids made in later milliseconds sort after every id made before them; none repeat."""
    made = [new_run_id() for _ in range(2000)]
    assert len(set(made)) == len(made)
    by_ms: dict[int, list[UUID]] = {}
    for run_id in made:
        by_ms.setdefault(run_id.int >> 80, []).append(run_id)
    instants = list(by_ms)
    assert instants == sorted(instants)  # made in this order
    for earlier, later in itertools.pairwise(instants):
        assert max(by_ms[earlier]) < min(by_ms[later])
    assert all(r.version == 7 for r in made)


def test_short_id__tells_apart_runs_made_in_the_same_minute() -> None:
    """Tables show eight hex digits of an id: the random end, not the first eight, which a
    version 7 id shares with every run made within about a minute of it."""
    made = [new_run_id() for _ in range(200)]
    assert len({str(r)[:8] for r in made}) <= 2  # why not the first digits
    assert len({short_id(r) for r in made}) == len(made)
    assert all(str(r).endswith(short_id(r)) for r in made)
