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
