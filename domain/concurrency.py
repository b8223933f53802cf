"""Concurrency limits per key (ADR 0078, issue 28).

A run may carry a concurrency key (a tenant, a mailbox) and the limit its key had when the
run was enqueued: at most that many runs of one key are running at once, across every
worker, and the claim serves the keys with runs to take round-robin (least recently served
first). The key and the limit are resolved at enqueue, recorded in the run's `Queued` event
and kept as columns of the run index; the store enforces the limit in the claim.

Key syntax: 1 to 128 of letters, digits and `_ . : @ / + -`, starting with a letter or a
digit (`tenant:acme`, `mailbox:ops@example.com`). Keys are case-sensitive and never contain
a wildcard, so a key is never mistaken for a pattern.

Limits are declared per pattern (`App.limit("tenant:*", 3)`): `*` matches any run of
characters, `?` any one character. The most specific pattern matching a key gives its
limit: the one with the most literal (non-wildcard) characters, and of those the one
declared first. An agent's `concurrency_limit` applies to keys no pattern matches.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Any

KEY_SYNTAX = (
    "1 to 128 of letters, digits, '_', '.', ':', '@', '/', '+', '-', "
    "starting with a letter or a digit"
)
CONCURRENCY_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/+-]{0,127}")
# A pattern: a key's characters and the wildcards `*` and `?`.
KEY_PATTERN = re.compile(r"[A-Za-z0-9*?][A-Za-z0-9_.:@/+*?-]{0,127}")
# The largest limit: far above any sensible one, and an int4 column on both backends.
MAX_LIMIT = 1_000_000


def check_key(key: Any) -> str:
    """`key` if it can be a concurrency key; ValueError saying what a key is otherwise."""
    if not isinstance(key, str) or CONCURRENCY_KEY.fullmatch(key) is None:
        raise ValueError(f"invalid concurrency key {str(key)[:140]!r}: {KEY_SYNTAX}")
    return key


def check_pattern(pattern: Any) -> str:
    """`pattern` if it can be a key pattern; ValueError otherwise."""
    if not isinstance(pattern, str) or KEY_PATTERN.fullmatch(pattern) is None:
        raise ValueError(
            f"invalid key pattern {str(pattern)[:140]!r}: a key's characters and the "
            "wildcards '*' and '?'"
        )
    return pattern


def check_limit(limit: Any) -> int:
    """`limit` if it is an integer from 1 to MAX_LIMIT; ValueError otherwise (a bool is not)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"invalid concurrency limit {limit!r}: an integer from 1 to {MAX_LIMIT:,}")
    return limit


def specificity(pattern: str) -> int:
    """How specific a pattern is: its literal characters (a key without wildcards is the
    most specific pattern for itself)."""
    return sum(1 for c in pattern if c not in "*?")


def limit_for(key: str, limits: dict[str, int]) -> int | None:
    """The limit of `key` among `limits` (pattern -> limit, in declaration order): the most
    specific matching pattern's, the first declared among equals; None when none matches."""
    best: tuple[int, int] | None = None
    for pattern, limit in limits.items():
        if fnmatchcase(key, pattern) and (best is None or specificity(pattern) > best[0]):
            best = (specificity(pattern), limit)
    return None if best is None else best[1]
