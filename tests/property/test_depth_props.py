"""`limits.depth` against its definition, on every shape of value a payload can take."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from steptrail.domain.limits import depth

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=3))


def reference(value: Any) -> int:
    """The definition: a scalar is 0, a container one more than its deepest member."""
    if isinstance(value, dict | OrderedDict):
        return 1 + max((reference(v) for v in value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max((reference(v) for v in value), default=0)
    return 0


values = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=2), inner, max_size=3),
        st.dictionaries(st.text(max_size=2), inner, max_size=3).map(OrderedDict),
    ),
    max_leaves=40,
)


@settings(max_examples=400)
@given(value=values, stop_after=st.integers(min_value=0, max_value=8))
def test_depth__equals_the_definition_up_to_where_it_stops(value: Any, stop_after: int) -> None:
    """The walk (depth first, one iterator per level, ADR 0053) counts what the recursive
    definition counts; past `stop_after` it stops at `stop_after + 1`, whichever branch is
    the deep one (a Mapping that is not a dict takes the slow path and counts the same)."""
    expected = reference(value)
    assert depth(value, stop_after=stop_after) == min(expected, stop_after + 1)


def test_depth__a_deeply_shared_value_stops_at_once() -> None:
    """A value whose members are shared at every level (2**200 paths) is judged by its
    first too-deep branch, not walked in full."""
    value: Any = []
    for _ in range(200):
        value = [value, value]
    assert depth(value) == 65
