"""The privacy filter for the per-step log: what of a step's content may reach the store.

Applied to every step payload and run result before the event exists, so nothing above the
configured level is ever written, logged or projected. Resumable state and the saved request
do not pass through here: they are kept verbatim beside the log and deleted on settle
(ADR 0008).

* `none` and `metadata` (the default): every content key is replaced by counts and lengths,
  plus `content_redacted: true`; keys the filter does not know are dropped (only counted),
  since an unknown key may carry content.
* `redacted`: content is kept, but secrets and e-mail addresses in every string are masked as
  `***` and each string is cut to 2,000 characters plus a truncation mark.
* `full`: verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from steptrail.domain.digest import digest
from steptrail.domain.enums import PrivacyLevel

# Keys whose values are content: messages sent, content, thinking, requested tool calls, raw
# provider output, tool arguments, tool result, tool artifacts.
CONTENT_KEYS = frozenset(
    {"messages", "content", "thinking", "tool_calls", "raw", "arguments", "result", "artifacts"}
)
# Keys that describe a step without revealing what was said; kept at every level.
METADATA_KEYS = frozenset(
    {
        "round",
        "finish_reason",
        "tokens",
        "input_tokens",
        "output_tokens",
        "cost",
        "model",
        "provider",
        "tool",
        "effect",
        "status_code",
        "attempt",
        "duration_ms",
    }
)

MAX_STRING = 2_000
TRUNCATION_MARK = "…[truncated]"
MASK = "***"

# Order matters: whole private-key blocks first, then URL credentials (before the e-mail rule,
# which would otherwise eat `password@host`), then keyed secrets, tokens, and e-mail last.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
            re.DOTALL,
        ),
        MASK,
    ),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]*:)[^/\s@]+@"), r"\1" + MASK + "@"),
    (re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9\-._~+/]{8,}=*"), r"\1\2" + MASK),
    (
        re.compile(
            r"(?i)\b((?:api|access|secret|private|client)[_-]?(?:key|secret|token)|secret|token"
            r"|password|passwd|pwd|auth)(\"?\s*[:=]\s*[\"']?)[^\s\"'&,;}]+"
        ),
        r"\1\2" + MASK,
    ),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), MASK),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"), MASK),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}\b"), MASK),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"), MASK),
    (re.compile(r"\bAIza[0-9A-Za-z\-_]{30,}"), MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}"), MASK),
    (re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}"), MASK),
)


def _scoped(pattern: re.Pattern[str]) -> str:
    """`pattern` as a group that carries its own flags, to sit in an alternation."""
    source, flags = pattern.pattern, ""
    if source.startswith("(?i)"):
        source, flags = source[4:], "i"
    if pattern.flags & re.DOTALL:
        flags += "s"
    return f"(?{flags}:{source})" if flags else f"(?:{source})"


# Matches wherever any of the patterns matches. Most strings on the hot path (step names,
# kinds, short values) hold no secret: one search of this answers for all twelve patterns
# (a few times cheaper than twelve substitutions on a short string), and only a string it
# matches goes through the substitutions, in order, exactly as before.
_ANY_SECRET = re.compile("|".join(_scoped(pattern) for pattern, _ in _PATTERNS))


def mask_secrets(text: str) -> str:
    """`text` with every secret and e-mail address it contains replaced by `***`."""
    if _ANY_SECRET.search(text) is None:
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_string(text: str) -> str:
    """Masked, then cut to `MAX_STRING` characters plus the truncation mark."""
    masked = mask_secrets(text)
    if len(masked) > MAX_STRING:
        return masked[:MAX_STRING] + TRUNCATION_MARK
    return masked


def _walk(value: Any, on_string: Any) -> Any:
    """`value` with `on_string` applied to every string in it, dictionary keys included."""
    if isinstance(value, str):
        return on_string(value)
    if isinstance(value, Mapping):
        return {on_string(str(k)): _walk(v, on_string) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, on_string) for v in value]
    return value


def _redact(value: Any) -> Any:
    return _walk(value, redact_string)


def _mask(value: Any) -> Any:
    return _walk(value, mask_secrets)


def _length(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple, Mapping)):
        return sum(_length(v) for v in (value.values() if isinstance(value, Mapping) else value))
    if value is None:
        return 0
    return len(str(value))


def _count(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return len(value)
    return 0 if value is None else 1


def tool_label(name: str, level: PrivacyLevel | str, declared: frozenset[str] | None) -> str:
    """How a tool's name appears in the log and in log lines (ADR 0019).

    A name the app declared (`app.tool(...)`) is the code's vocabulary and is kept at every
    level. Any other name may have been chosen by a request, so it is free text: at `none`
    and `metadata` it becomes `undeclared:<first 12 hex of its SHA-256>` (the same name always
    gives the same label, so runs can still be grouped by it); at `redacted` its secrets are
    masked; at `full` it is kept. `declared=None` means every name counts as declared.
    """
    level = PrivacyLevel.parse(level)
    if declared is None or name in declared or level is PrivacyLevel.FULL:
        return name
    if level is PrivacyLevel.REDACTED:
        return redact_string(name)
    return "undeclared:" + digest(name).removeprefix("sha256:")[:12]


def _tool_names(calls: Any, level: PrivacyLevel, declared: frozenset[str] | None) -> list[str]:
    items = calls if isinstance(calls, (list, tuple)) else [calls]
    names = []
    for call in items:
        name = call.get("name") if isinstance(call, Mapping) else None
        names.append(tool_label(name, level, declared) if isinstance(name, str) else "?")
    return names


def _artifact_types(artifacts: Any) -> list[str]:
    items = artifacts if isinstance(artifacts, (list, tuple)) else [artifacts]
    kinds = []
    for item in items:
        kind = item.get("type") if isinstance(item, Mapping) else None
        kinds.append(kind if isinstance(kind, str) else type(item).__name__)
    return kinds


# The keys a summary is made of besides the metadata keys: `_summarise` writes these and
# no others.
SUMMARY_KEYS = frozenset(
    {
        "content_redacted",
        "messages_sent_count",
        "content_length",
        "thinking_length",
        "requested_tool_names",
        "raw_length",
        "arguments_length",
        "tool_result_length",
        "artifact_count",
        "artifact_types",
        "other_keys_dropped",
    }
)
# A summary's keys are this code's own vocabulary, never text from a payload: masking them
# changes nothing, which is checked here once rather than paid for on every step (a search
# of a key like `messages_sent_count` costs about as much as the rest of the filter).
_SAFE_KEYS = METADATA_KEYS | SUMMARY_KEYS
if any(mask_secrets(key) != key for key in _SAFE_KEYS):  # pragma: no cover - a bad edit
    raise AssertionError("a summary key would be masked: _mask_summary may not skip it")


def _mask_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """`_mask` of a summary: every string value masked, however deep; its keys (all in
    `_SAFE_KEYS`) are left as they are, which is what masking them would give."""
    return {str(key): _walk(value, mask_secrets) for key, value in summary.items()}


def _summarise(
    payload: Mapping[str, Any], level: PrivacyLevel, declared: frozenset[str] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {k: payload[k] for k in payload if k in METADATA_KEYS}
    if isinstance(out.get("tool"), str):
        out["tool"] = tool_label(out["tool"], level, declared)
    out["content_redacted"] = True
    if "messages" in payload:
        out["messages_sent_count"] = _count(payload["messages"])
    if "content" in payload:
        out["content_length"] = _length(payload["content"])
    if "thinking" in payload:
        out["thinking_length"] = _length(payload["thinking"])
    if "tool_calls" in payload:
        out["requested_tool_names"] = _tool_names(payload["tool_calls"], level, declared)
    if "raw" in payload:
        out["raw_length"] = _length(payload["raw"])
    if "arguments" in payload:
        out["arguments_length"] = _length(payload["arguments"])
    if "result" in payload:
        out["tool_result_length"] = _length(payload["result"])
    if "artifacts" in payload:
        out["artifact_count"] = _count(payload["artifacts"])
        out["artifact_types"] = _artifact_types(payload["artifacts"])
    others = [k for k in payload if k not in METADATA_KEYS and k not in CONTENT_KEYS]
    if others:
        out["other_keys_dropped"] = len(others)
    return out


def filter_payload(
    payload: Mapping[str, Any],
    level: PrivacyLevel | str,
    *,
    declared_tools: frozenset[str] | None = None,
) -> dict[str, Any]:
    """The part of `payload` that level `level` lets into the per-step log.

    `declared_tools`: the tool names the app declared; other names in `tool` and in
    requested tool calls are labelled by `tool_label` at `none`/`metadata`.
    """
    level = PrivacyLevel.parse(level)
    if level is PrivacyLevel.FULL:
        return dict(payload)
    if level is PrivacyLevel.REDACTED:
        # Metadata keys keep their full length but not their secrets; content is also cut.
        return {
            redact_string(k): (_mask(v) if k in METADATA_KEYS else _redact(v))
            for k, v in payload.items()
        }
    # What survives at metadata is meant to describe, not reveal; but any string in it (a
    # model name, a requested tool's name, an artifact type) could still carry an address or
    # a secret, so every one of them is masked, however deeply nested.
    return _mask_summary(_summarise(payload, level, declared_tools))


def filter_schema(schema: Mapping[str, Any] | None, level: PrivacyLevel | str) -> Any:
    """What of a declared input schema the log may keep (the `Suspended` event, the run's
    waiting state); the schema itself is kept verbatim only in the saved resumable state.

    At `full`, the schema; at `redacted`, the schema with every string masked and cut; at
    `none`/`metadata`, only its digest and its property names (masked), since titles,
    descriptions, examples, defaults and enums are free text (ADR 0019).
    """
    if schema is None:
        return None
    level = PrivacyLevel.parse(level)
    if level is PrivacyLevel.FULL:
        return dict(schema)
    if level is PrivacyLevel.REDACTED:
        return _redact(schema)
    properties = schema.get("properties")
    names = sorted(str(k) for k in properties) if isinstance(properties, Mapping) else []
    return {
        "content_redacted": True,
        "schema_digest": digest(dict(schema)),
        "properties": [mask_secrets(n) for n in names],
    }
