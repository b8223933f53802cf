"""Property tests of the privacy filter: planted secrets and addresses never pass the filter.

Payloads are random nested content (dicts, lists, strings) under the content keys, with
realistic secrets (random bodies in the shapes real providers issue) and e-mail addresses
planted inside the strings, separated from the surrounding text the way prose separates them.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from steptrail.domain.privacy import (
    _PATTERNS,
    CONTENT_KEYS,
    METADATA_KEYS,
    filter_payload,
    mask_secrets,
)

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
B64URL = ALNUM + "-_"
B64 = ALNUM + "+/"

# Every key the metadata summary may hold besides the metadata keys themselves.
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
# Keys of nested content. `name` and `type` are left out on purpose: the summary lists the
# names of requested tools and the types of artifacts, which tests/unit/test_privacy.py covers.
NESTED_KEYS = ("text", "body", "parts", "value", "items", "data", "note", "role")


def _chars(alphabet: str, size: int, max_size: int | None = None) -> st.SearchStrategy[str]:
    return st.text(
        alphabet=alphabet, min_size=size, max_size=size if max_size is None else max_size
    )


# Each template yields (text to plant, the secret part that must never survive).
# Bodies without a distinctive prefix are at least 12 characters, longer than any run of
# letters in the summary's own key names, so a match is a leak and never a coincidence.
_SECRET = _chars(ALNUM, 12, 32)


def _whole(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[str, str]]:
    return strategy.map(lambda s: (s, s))


SECRETS: st.SearchStrategy[tuple[str, str]] = st.one_of(
    _whole(_chars(ALNUM + "-_", 20, 48).map(lambda b: "sk-" + b)),
    _whole(_chars(UPPER_DIGITS, 16).map(lambda b: "AKIA" + b)),
    _whole(_chars(ALNUM, 36).map(lambda b: "ghp_" + b)),
    _whole(
        st.tuples(_chars(string.digits, 10, 13), _chars(ALNUM, 10, 24)).map(
            lambda p: f"xoxb-{p[0]}-{p[1]}"
        )
    ),
    _whole(_chars(B64URL, 35).map(lambda b: "AIza" + b)),
    _whole(
        st.tuples(_chars(B64URL, 10, 40), _chars(B64URL, 10, 60), _chars(B64URL, 20, 43)).map(
            lambda p: f"eyJ{p[0]}.eyJ{p[1]}.{p[2]}"
        )
    ),
    _SECRET.map(lambda s: (f"Authorization: Bearer {s}", s)),
    st.tuples(st.sampled_from(["https", "postgres", "redis"]), _SECRET).map(
        lambda p: (f"{p[0]}://svc:{p[1]}@db.internal.example.com/app", p[1])
    ),
    st.tuples(
        st.sampled_from(["api_key=", "password: ", '"client_secret": "', "access_token="]),
        _SECRET,
    ).map(lambda p: (p[0] + p[1], p[1])),
    _chars(B64, 24, 64).map(
        lambda b: (f"-----BEGIN PRIVATE KEY-----\n{b}\n-----END PRIVATE KEY-----", b)
    ),
)

EMAILS: st.SearchStrategy[str] = st.tuples(
    _chars(string.ascii_lowercase + string.digits + "._+-", 1, 16),
    _chars(string.ascii_lowercase + string.digits, 1, 12),
    st.lists(_chars(string.ascii_lowercase, 2, 8), max_size=2),
    _chars(string.ascii_lowercase, 2, 6),
).map(lambda p: f"{p[0]}@{'.'.join([p[1], *p[2]])}.{p[3]}")

FILLER: st.SearchStrategy[str] = st.text(max_size=40)


@dataclass
class Planted:
    """A generated payload and what was hidden in it."""

    payload: dict[str, Any]
    secrets: list[str] = field(default_factory=list)
    emails: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    fillers: list[str] = field(default_factory=list)

    def hidden(self) -> list[str]:
        """The planted secrets and addresses, less any the innocent filler happens to contain
        too (Hypothesis likes to repeat a drawn value, and filler is kept at redacted)."""
        return [
            needle
            for needle in self.secrets + self.emails
            if not any(needle in filler for filler in self.fillers)
        ]


@st.composite
def payloads(draw: st.DrawFn) -> Planted:
    """Random content under random content keys, secrets and addresses planted in strings."""
    planted = Planted(payload={})

    def filler() -> str:
        text = draw(FILLER)
        planted.fillers.append(text)
        return text

    def leaf() -> str:
        parts = [filler()]
        for _ in range(draw(st.integers(min_value=0, max_value=2))):
            if draw(st.booleans()):
                text, secret = draw(SECRETS)
                planted.secrets.append(secret)
            else:
                text = draw(EMAILS)
                planted.emails.append(text)
            parts += [text, filler()]
        value = " ".join(parts)
        planted.texts.append(value)
        return value

    def node(depth: int) -> Any:
        shape = draw(st.sampled_from(["leaf", "list", "dict"])) if depth < 3 else "leaf"
        if shape == "leaf":
            return leaf()
        size = draw(st.integers(min_value=0, max_value=3))
        if shape == "list":
            return [node(depth + 1) for _ in range(size)]
        keys = draw(st.lists(st.sampled_from(NESTED_KEYS), max_size=size, unique=True))
        return {key: node(depth + 1) for key in keys}

    for key in draw(st.sets(st.sampled_from(sorted(CONTENT_KEYS)), min_size=1)):
        planted.payload[key] = node(0)
    # A few metadata keys with short values, so they can never contain a content string.
    if draw(st.booleans()):
        planted.payload["model"] = "m-1"
    if draw(st.booleans()):
        planted.payload["tokens"] = draw(st.integers(min_value=0, max_value=10**6))
    if draw(st.booleans()):
        planted.payload["round"] = draw(st.integers(min_value=0, max_value=50))
    return planted


def string_values(value: Any) -> Iterator[str]:
    """Every string value inside `value`, however deeply nested (dict keys excluded)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from string_values(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from string_values(item)


@settings(max_examples=200)
@given(planted=payloads(), level=st.sampled_from(["none", "metadata"]))
def test_filter_payload__metadata_leaks_no_secret_address_or_content(
    planted: Planted, level: str
) -> None:
    """At none and metadata, no planted secret, no address and no content string gets through."""
    out = filter_payload(planted.payload, level)
    dumped = json.dumps(out, ensure_ascii=False)
    for needle in planted.secrets + planted.emails:
        assert needle not in dumped
    assert set(out) <= METADATA_KEYS | SUMMARY_KEYS
    assert out["content_redacted"] is True
    values = list(string_values(out))
    for text in planted.texts:
        if len(text) >= 8:
            assert not any(text in value for value in values)


@settings(max_examples=200)
@given(planted=payloads())
def test_filter_payload__redacted_masks_every_secret_and_address(planted: Planted) -> None:
    """At redacted, no planted secret and no e-mail address survives, however deep it sits."""
    out = filter_payload(planted.payload, "redacted")
    dumped = json.dumps(out, ensure_ascii=False)
    for needle in planted.hidden():
        assert needle not in dumped
    assert set(out) == set(planted.payload)


@given(planted=payloads())
def test_filter_payload__full_is_identity(planted: Planted) -> None:
    """At full, the filter returns exactly the payload it was given."""
    assert filter_payload(planted.payload, "full") == planted.payload


def _every_substitution(text: str) -> str:
    """The masking as it is defined: each pattern substituted in turn, with no prefilter."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


@settings(max_examples=300)
@given(planted=payloads(), noise=st.text(max_size=60))
def test_mask_secrets__prefilter_changes_nothing(planted: Planted, noise: str) -> None:
    """The one-search prefilter only skips strings no pattern matches: masking any string,
    secret-bearing or not, equals substituting every pattern in turn."""
    for text in [*planted.texts, *planted.fillers, noise, noise + " " + " ".join(planted.texts)]:
        assert mask_secrets(text) == _every_substitution(text)
