"""Run ids: UUIDs that sort by the millisecond they were made (RFC 9562 version 7, ADR 0052).

Every table holding something of a run is keyed by its id: the index, the log's
(run, version) key, the summaries, dead letters, saved requests, the step journal
(PostgreSQL) and the tombstones. With random ids (version 4) each run's rows sit on their
own pages of every one of those trees, wherever the run falls, so a purge of the oldest
runs dirties one page per tree per run, scattered over the whole file. Ids that start with
their creation instant keep the runs made together on the same pages, and the oldest runs at
one end of each tree.

The id is 48 bits of Unix milliseconds, the version (7), 12 random bits, the variant (RFC)
and 62 random bits: still 74 bits nobody can guess. Its hex form (the SQLite key) and its
bytes (PostgreSQL's `uuid` order) both sort by the milliseconds first. Runs made within the
same millisecond are in random order among themselves; nothing needs them in order.
"""

from __future__ import annotations

from uuid import UUID

ENTROPY_BYTES = 10  # 80 bits drawn, 74 kept (6 go to the version and the variant)
_MS_MASK = (1 << 48) - 1
_VERSION = 0x7 << 76
_VERSION_MASK = 0xF << 76
_VARIANT = 0x2 << 62
_VARIANT_MASK = 0x3 << 62


def time_ordered_id(unix_ms: int, entropy: bytes) -> UUID:
    """The version 7 UUID of a run made at `unix_ms` (milliseconds since the Unix epoch),
    with `entropy` (ENTROPY_BYTES random bytes) for the rest."""
    if len(entropy) != ENTROPY_BYTES:
        raise ValueError(f"a run id needs {ENTROPY_BYTES} random bytes, got {len(entropy)}")
    if not 0 <= unix_ms <= _MS_MASK:
        raise ValueError(f"{unix_ms} ms is outside what 48 bits of milliseconds hold")
    value = unix_ms << 80 | int.from_bytes(entropy, "big")
    value = (value & ~_VERSION_MASK) | _VERSION
    value = (value & ~_VARIANT_MASK) | _VARIANT
    return UUID(int=value)


def short_id(run_id: UUID) -> str:
    """The eight hex digits a table shows of a run id: its last ones, random in every id
    (version 7 ids share their first digits with every run made in the same minute)."""
    return run_id.hex[-8:]


SHORTEST_REFERENCE = 8  # hex digits: what a table shows of an id (`short_id`)
CANDIDATES_SHOWN = 5  # an ambiguous reference lists at most this many runs


def run_reference(text: str) -> UUID | str:
    """What an operator typed for a run: the UUID it spells in full, or the lowercase hex
    digits of a part of one (a prefix, or the suffix a table shows) to look up.

    Dashes and surrounding white space are ignored, so `090fedc9`, `090F-EDC9` and a full
    id pasted with its dashes all work.

    Raises:
        InvalidRunId: not hex, or fewer than SHORTEST_REFERENCE digits, or longer than an id.
    """
    from steptrail.domain.errors import InvalidRunId

    digits = text.strip().replace("-", "").lower()
    shown = text.strip()[:80]
    if not digits or any(c not in "0123456789abcdef" for c in digits) or len(digits) > 32:
        raise InvalidRunId(
            f"{shown!r} is not a run id: give the full id or at least {SHORTEST_REFERENCE} "
            "of its hex digits (the start, or the end a table shows)"
        )
    if len(digits) == 32:
        return UUID(hex=digits)
    if len(digits) < SHORTEST_REFERENCE:
        raise InvalidRunId(
            f"{shown!r} is too short for a run id: give at least {SHORTEST_REFERENCE} of its "
            "hex digits (the start, or the end a table shows)"
        )
    return digits


def prefix_bounds(digits: str) -> tuple[UUID, UUID]:
    """The lowest and highest ids that start with `digits` (a key range to walk)."""
    return UUID(hex=digits.ljust(32, "0")), UUID(hex=digits.ljust(32, "f"))


_CANONICAL = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
_HEX_AT = [i for i, c in enumerate(_CANONICAL) if c == "x"]


def dashed_suffix(digits: str) -> str:
    """How the last `len(digits)` hex digits of an id read in its canonical text form (with
    the dashes where they fall), so a store can match the text it already has."""
    start = _HEX_AT[32 - len(digits)]
    chars = iter(digits)
    return "".join(next(chars) if c == "x" else c for c in _CANONICAL[start:])
