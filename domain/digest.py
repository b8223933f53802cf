"""Content digests: SHA-256 over a canonical JSON form, so equal content means equal digest."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# One encoder, built once: json.dumps with options builds a new one on every call, which
# the step journal's fingerprints (one per step) would pay each time.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> bytes:
    """JSON with sorted keys and no insignificant white space; raises on unserialisable input."""
    return _CANONICAL.encode(value).encode("utf-8")


def digest(value: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of `value`."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()
