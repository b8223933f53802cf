"""How events and run states become bytes and back.

An event is stored as its stable topic plus the JSON of its payload. A payload written by an
older class version carries `"_v"`, and is upcast before it is validated; the current version
omits it, which keeps the common case a single `model_validate_json` call.
"""

from __future__ import annotations

import json
from typing import Any

from steptrail.domain.run import EVENT_TYPES, RunEvent


class UnknownTopic(LookupError):
    """The log holds an event whose topic this version of steptrail does not know."""


def encode_event(event: RunEvent) -> tuple[str, bytes]:
    """(topic, state) of an event."""
    cls = type(event)
    body = event.model_dump_json().encode("utf-8")
    if cls.VERSION != 1:
        data = json.loads(body)
        data["_v"] = cls.VERSION
        body = json.dumps(data, separators=(",", ":")).encode("utf-8")
    return cls.TOPIC, body


def decode_event(topic: str, state: bytes) -> RunEvent:
    """The event a stored (topic, state) pair describes, upcast to its current version."""
    try:
        cls = EVENT_TYPES[topic]
    except KeyError:
        raise UnknownTopic(topic) from None
    if cls.VERSION == 1 and b'"_v"' not in state:
        return cls.model_validate_json(state)
    data: dict[str, Any] = json.loads(state)
    version = int(data.pop("_v", 1))
    if version != cls.VERSION:
        data = cls.upcast(data, version)
    return cls.model_validate(data)
