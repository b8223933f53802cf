"""How events and run states become bytes and back.

An event is stored as its stable topic plus the JSON of its payload. A payload written by an
older class version carries `"_v"`, and is upcast before it is validated; the current version
omits it, which keeps the common case a single `model_validate_json` call.

Reading survives a bad row (ADR 0019). Since 0.2 nothing deeper than `MAX_DEPTH` levels is
written, but logs written before may hold step payloads nested deeper than pydantic-core's
JSON parser accepts (200 levels). Such an event is decoded by the standard library instead and
its content cut at `MAX_DEPTH` levels (a marker string stands in for what was deeper), with a
warning naming the run and version: the event's own fields, which is all a fold reads, are
intact. Anything still unreadable raises `UnreadableEvent` naming the run and version.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from steptrail.domain.errors import UnreadableEvent
from steptrail.domain.limits import MAX_DEPTH
from steptrail.domain.run import EVENT_TYPES, RunEvent
from steptrail.infrastructure.logging import steptrail_logger

CLIPPED = f"…[nested deeper than {MAX_DEPTH} levels: not shown]"


class UnknownTopic(UnreadableEvent):
    """The log holds an event whose topic this version of steptrail does not know: written
    by a newer steptrail (a rolling upgrade, a downgrade) or by hand. Every reader treats it
    as it treats any event it cannot decode: `show` and `verify` name the run and version
    (exit 1), the projection runner stops before it and keeps trying (ADR 0066)."""


def encode_event(event: RunEvent) -> tuple[str, bytes]:
    """(topic, state) of an event.

    The class's pydantic-core serializer is called directly: it returns the UTF-8 bytes the
    log stores, where `model_dump_json` decodes them to text (which was encoded back) after
    passing its fifteen defaults on; the bytes are the same (ADR 0055). Every step's append
    comes through here.
    """
    cls = type(event)
    body: bytes = cls.__pydantic_serializer__.to_json(event)
    if cls.VERSION != 1:
        data = json.loads(body)
        data["_v"] = cls.VERSION
        body = json.dumps(data, separators=(",", ":")).encode("utf-8")
    return cls.TOPIC, body


def decode_event(topic: str, state: bytes, *, where: str = "an event") -> RunEvent:
    """The event a stored (topic, state) pair describes, upcast to its current version.

    Args:
        where: how to name the row in a report, e.g. "event 5 of run <id>".

    Raises:
        UnknownTopic: a topic this version does not know.
        UnreadableEvent: the payload cannot be decoded even with its content cut.
    """
    try:
        cls = EVENT_TYPES[topic]
    except KeyError:
        raise UnknownTopic(
            f"{where} cannot be read: its topic {topic!r} is not one this version of "
            "steptrail knows (written by a newer version?)"
        ) from None
    try:
        if cls.VERSION == 1 and b'"_v"' not in state:
            return cls.model_validate_json(state)
        return _validate(cls, json.loads(state))
    except (ValidationError, ValueError, RecursionError) as error:
        fast_error = error_reason(error)
    try:
        data = json.loads(state)
    except (ValueError, RecursionError):
        raise UnreadableEvent(f"{where} cannot be read: {fast_error}") from None
    clipped = _clip(data, 0)
    try:
        event = _validate(cls, clipped)
    except (ValidationError, ValueError, RecursionError) as error:
        raise UnreadableEvent(f"{where} cannot be read: {error_reason(error)}") from None
    steptrail_logger().warning("event_content_clipped", where=where, reason=fast_error)
    return event


def error_reason(error: Exception) -> str:
    # pydantic quotes the start of the input after " [type="; that is content, keep it out.
    lines = str(error).splitlines()
    text = lines[1] if isinstance(error, ValidationError) and len(lines) > 1 else lines[0]
    return text.split(" [type=")[0].strip()[:200]


def _validate(cls: type[RunEvent], data: dict[str, Any]) -> RunEvent:
    version = int(data.pop("_v", 1))
    if version != cls.VERSION:
        data = cls.upcast(data, version)
    return cls.model_validate(data)


def _clip(value: Any, level: int) -> Any:
    # Recursion is bounded: it stops at MAX_DEPTH whatever the input's depth.
    if isinstance(value, Mapping):
        if level >= MAX_DEPTH:
            return CLIPPED
        return {k: _clip(v, level + 1) for k, v in value.items()}
    if isinstance(value, list):
        if level >= MAX_DEPTH:
            return CLIPPED
        return [_clip(v, level + 1) for v in value]
    return value
