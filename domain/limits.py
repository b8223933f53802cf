"""Bounds on what may enter the log: how deeply a value nests and how large it is.

Every value that reaches a stored event or saved state (the request, step payloads, results,
submitted input, resumable state, declared input schemas) is checked here first, at the
door, so that whatever is accepted can always be read back (ADR 0019). The depth bound sits
far below the JSON decoders' own limits (pydantic-core's is 200 levels; the standard
library's is Python's recursion limit), leaving room for the event's own nesting around the
value.

The walk is iterative: a hostile value a thousand levels deep costs a loop, not a stack.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

ENQUEUE_BATCH = 1000  # runs per statement (PostgreSQL) or transaction (SQLite) in enqueue_many
MAX_DAYS = 36_500  # a hundred years: further and the cutoff date leaves the calendar

MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted anywhere in a stored value."""

DEFAULT_MAX_REQUEST_BYTES = 1_048_576
"""Default cap on a request's canonical JSON (STEPTRAIL_MAX_REQUEST_BYTES)."""

DEFAULT_MAX_PAYLOAD_BYTES = 8_388_608
"""Default cap on one step payload, result, input or saved state (STEPTRAIL_MAX_PAYLOAD_BYTES)."""


class PayloadRejected(ValueError):
    """A value is too deep or too large to be stored; nothing was written."""


class PayloadTooDeep(PayloadRejected):
    """A value nests objects and arrays more than `MAX_DEPTH` levels deep."""


class PayloadTooLarge(PayloadRejected):
    """A value's JSON is larger than the configured cap."""


def depth(value: Any, *, stop_after: int = MAX_DEPTH) -> int:
    """How many levels of objects and arrays `value` nests (a scalar is 0), counting no
    further than `stop_after + 1`.

    Depth first, with one iterator per open level (so the walk stops as soon as one branch
    is too deep, and holds at most `stop_after + 1` iterators). Plain dicts, lists and
    scalars, which is what payloads are made of, are told apart by their exact type before
    the slower `Mapping` check: every step payload and result is walked here."""
    deepest = 0
    levels: list[Iterator[Any]] = [iter((value,))]
    while levels:
        for item in levels[-1]:
            kind = type(item)
            if kind is dict:
                children: Iterable[Any] = item.values()
            elif kind is list or kind is tuple:
                children = item
            elif kind in _SCALARS:
                continue
            elif isinstance(item, Mapping):
                children = item.values()
            elif isinstance(item, (list, tuple)):
                children = item
            else:
                continue
            if len(levels) > deepest:  # this container sits at level len(levels)
                deepest = len(levels)
                if deepest > stop_after:
                    return deepest
            levels.append(iter(children))
            break
        else:
            levels.pop()
    return deepest


_SCALARS = frozenset({str, int, float, bool, type(None)})


def check_depth(value: Any, what: str) -> None:
    """Raise PayloadTooDeep if `value` nests more than `MAX_DEPTH` levels.

    Raises:
        PayloadTooDeep: naming `what` and the limit.
    """
    if depth(value) > MAX_DEPTH:
        raise PayloadTooDeep(f"{what} nests more than {MAX_DEPTH} levels of objects and arrays")


# One encoder, built once: json.dumps with options builds a new one on every call, and the
# step record measures every payload and value (ADR 0090).
_SIZE_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)


def json_size(value: Any) -> int:
    """The length of `value`'s compact JSON text (not ASCII-escaped; an object JSON has no
    form for becomes its `str`): what the payload cap measures."""
    return len(_SIZE_ENCODER.encode(value))


def check_size(size: int, limit: int, what: str) -> None:
    """Raise PayloadTooLarge if `size` bytes exceed `limit`.

    Raises:
        PayloadTooLarge: naming `what`, its size and the limit.
    """
    if size > limit:
        raise PayloadTooLarge(f"{what} is {size:,} bytes of JSON; the limit is {limit:,} bytes")
