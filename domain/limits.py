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

from collections.abc import Mapping
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
    further than `stop_after + 1`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        if deepest > stop_after:
            return deepest
        stack.extend((child, level) for child in children)
    return deepest


def check_depth(value: Any, what: str) -> None:
    """Raise PayloadTooDeep if `value` nests more than `MAX_DEPTH` levels.

    Raises:
        PayloadTooDeep: naming `what` and the limit.
    """
    if depth(value) > MAX_DEPTH:
        raise PayloadTooDeep(f"{what} nests more than {MAX_DEPTH} levels of objects and arrays")


def check_size(size: int, limit: int, what: str) -> None:
    """Raise PayloadTooLarge if `size` bytes exceed `limit`.

    Raises:
        PayloadTooLarge: naming `what`, its size and the limit.
    """
    if size > limit:
        raise PayloadTooLarge(f"{what} is {size:,} bytes of JSON; the limit is {limit:,} bytes")
