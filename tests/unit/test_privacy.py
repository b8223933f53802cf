"""Unit tests of the per-step log's privacy filter at each level, and of secret masking."""

from __future__ import annotations

import json
from typing import Any

import pytest

from steptrail.domain.enums import PrivacyLevel
from steptrail.domain.privacy import (
    CONTENT_KEYS,
    MASK,
    MAX_STRING,
    METADATA_KEYS,
    TRUNCATION_MARK,
    filter_payload,
    mask_secrets,
    redact_string,
)

EMAIL = "alice.smith+agents@mail.example.co.uk"
OPENAI_KEY = "sk-proj-4fG7hJ9kL2mN5pQ8rS1tV3wX"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
GITHUB_PAT = "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
SLACK_BOT = "xoxb-123456789012-abcdefGHIJKL"
GOOGLE_KEY = "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIn0"
    ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
    "-----END RSA PRIVATE KEY-----"
)


def payload() -> dict[str, Any]:
    """A step payload with every content key, some metadata keys and one unknown key."""
    return {
        "model": "gpt-4o-mini",
        "provider": "openai",
        "round": 3,
        "finish_reason": "tool_calls",
        "tokens": 120,
        "input_tokens": 100,
        "output_tokens": 20,
        "cost": 0.0012,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": f"mail {EMAIL} the report"},
        ],
        "content": "Sending the report now.",
        "thinking": "the user wants mail",
        "tool_calls": [
            {"name": "send_email", "arguments": {"to": EMAIL}},
            {"name": "search", "arguments": {"q": "report"}},
        ],
        "raw": {"id": "resp_1", "text": "Sending"},
        "arguments": {"to": EMAIL, "body": "hello"},
        "result": "sent",
        "artifacts": [{"type": "image", "data": "AAAA"}, "plain note"],
        "customer_notes": f"call me, {EMAIL}",
    }


# -- levels ----------------------------------------------------------------------------------------


def test_filter_payload__full_is_verbatim() -> None:
    """At full, the payload passes unchanged, secrets and all."""
    p = payload()
    assert filter_payload(p, PrivacyLevel.FULL) == p
    assert filter_payload(p, "full") == p


@pytest.mark.parametrize("level", [PrivacyLevel.NONE, PrivacyLevel.METADATA])
def test_filter_payload__metadata_summarises_content(level: PrivacyLevel) -> None:
    """At none and metadata, content becomes counts and lengths; metadata keys stay as they are."""
    out = filter_payload(payload(), level)
    assert out == {
        "model": "gpt-4o-mini",
        "provider": "openai",
        "round": 3,
        "finish_reason": "tool_calls",
        "tokens": 120,
        "input_tokens": 100,
        "output_tokens": 20,
        "cost": 0.0012,
        "content_redacted": True,
        "messages_sent_count": 2,
        "content_length": len("Sending the report now."),
        "thinking_length": len("the user wants mail"),
        "requested_tool_names": ["send_email", "search"],
        "raw_length": len("resp_1") + len("Sending"),
        "arguments_length": len(EMAIL) + len("hello"),
        "tool_result_length": len("sent"),
        "artifact_count": 2,
        "artifact_types": ["image", "str"],
        "other_keys_dropped": 1,
    }


@pytest.mark.parametrize("level", ["none", "metadata"])
def test_filter_payload__metadata_leaks_no_content(level: str) -> None:
    """Nothing said in the content, and no e-mail address, reaches the metadata summary."""
    dumped = json.dumps(filter_payload(payload(), level))
    for needle in (EMAIL, "be brief", "Sending", "the user wants", "report", "hello", "AAAA"):
        assert needle not in dumped
    assert "customer_notes" not in dumped


def test_filter_payload__metadata_drops_unknown_keys() -> None:
    """Unknown keys may carry content, so they are dropped and only counted."""
    out = filter_payload({"note": "x", "debug": {"a": 1}, "tokens": 3}, "metadata")
    assert out == {"tokens": 3, "content_redacted": True, "other_keys_dropped": 2}


def test_filter_payload__metadata_empty_payload_still_marked() -> None:
    """Even an empty payload says its content was redacted, and nothing else."""
    assert filter_payload({}, "metadata") == {"content_redacted": True}


@pytest.mark.parametrize("key", sorted(METADATA_KEYS))
def test_filter_payload__metadata_keys_kept_at_every_level(key: str) -> None:
    """Each metadata key (tokens, cost, finish_reason, round, model, …) survives every level."""
    for level in PrivacyLevel:
        assert filter_payload({key: 7}, level)[key] == 7


@pytest.mark.parametrize("key", sorted(CONTENT_KEYS))
def test_filter_payload__content_key_replaced_at_metadata(key: str) -> None:
    """Each content key is absent at metadata and replaced by a count or length."""
    out = filter_payload({key: ["some content here"]}, "metadata")
    assert key not in out
    assert out["content_redacted"] is True
    assert "some content here" not in json.dumps(out)
    assert len(out) >= 2


def test_filter_payload__metadata_masks_kept_strings() -> None:
    """A metadata key's string is kept, but an address or secret inside it is masked."""
    out = filter_payload(
        {"provider": "https://svc:hunter22@api.example.com", "model": EMAIL}, "metadata"
    )
    assert out["provider"] == f"https://svc:{MASK}@api.example.com"
    assert out["model"] == MASK


def test_filter_payload__lengths_of_nested_content() -> None:
    """Lengths add up the strings of nested content; counts count list items."""
    out = filter_payload(
        {
            "content": [{"text": "abc"}, ["de", None, 12]],
            "messages": {"role": "user"},
            "artifacts": None,
        },
        "metadata",
    )
    assert out["content_length"] == 3 + 2 + 0 + 2
    assert out["messages_sent_count"] == 1
    assert out["artifact_count"] == 0
    assert out["artifact_types"] == ["NoneType"]


def test_filter_payload__tool_names_without_name() -> None:
    """A requested tool call without a string name is listed as `?`."""
    out = filter_payload({"tool_calls": [{"arguments": {}}, "raw", {"name": 3}]}, "metadata")
    assert out["requested_tool_names"] == ["?", "?", "?"]


@pytest.mark.parametrize("level", ["bogus", "", "  ", 3, "FULLY", "meta data"])
def test_filter_payload__invalid_level_means_metadata(level: object) -> None:
    """An invalid level is treated as metadata, the safe default."""
    p = payload()
    assert filter_payload(p, level) == filter_payload(p, "metadata")  # type: ignore[arg-type]
    assert PrivacyLevel.parse(level) is PrivacyLevel.METADATA


def test_privacy_level__parse_unset_value_means_metadata() -> None:
    """BUG: an unset level (None) is invalid and must mean metadata, not `none`.

    `PrivacyLevel.parse` turns the value into text first, and `str(None)` is "None", which
    lower-cases to the valid level `none`; the run's events then record `none` as their level.
    """
    assert PrivacyLevel.parse(None) is PrivacyLevel.METADATA


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("FULL", PrivacyLevel.FULL),
        (" Redacted ", PrivacyLevel.REDACTED),
        ("none", PrivacyLevel.NONE),
    ],
)
def test_privacy_level__parse_is_lenient_on_case_and_space(text: str, level: PrivacyLevel) -> None:
    """A level name in any case, with surrounding space, is that level."""
    assert PrivacyLevel.parse(text) is level


def test_filter_payload__redacted_keeps_content_masks_secrets() -> None:
    """At redacted, content is kept, with secrets and e-mail addresses masked everywhere."""
    p = payload()
    p["content"] = f"token {OPENAI_KEY} for {EMAIL}"
    p["result"] = ("ok", {EMAIL: [AWS_KEY, 3, None]})
    out = filter_payload(p, "redacted")
    assert out["content"] == f"token {MASK} for {MASK}"
    assert out["messages"][1] == {"role": "user", "content": f"mail {MASK} the report"}
    assert out["tool_calls"][0] == {"name": "send_email", "arguments": {"to": MASK}}
    assert out["result"] == ["ok", {MASK: [MASK, 3, None]}]
    assert out["customer_notes"] == f"call me, {MASK}"
    assert out["model"] == "gpt-4o-mini"
    assert out["round"] == 3
    assert EMAIL not in json.dumps(out)


def test_filter_payload__redacted_cuts_long_strings() -> None:
    """At redacted, each string longer than 2,000 characters is cut and marked."""
    out = filter_payload({"content": "x" * 5000, "raw": ["y" * 2000]}, "redacted")
    assert out["content"] == "x" * MAX_STRING + TRUNCATION_MARK
    assert out["raw"] == ["y" * 2000]


def test_filter_payload__redacted_masks_secrets_in_metadata_keys() -> None:
    """BUG: at redacted, a metadata key's string must be masked too, as at metadata.

    The module docstring promises that at redacted "secrets and e-mail addresses in every
    string are masked", and metadata level masks these very strings; redacted keeps them
    verbatim, so the stricter-sounding level leaks what the default level hides.
    """
    p = {"provider": "https://svc:hunter22@api.example.com", "model": EMAIL}
    out = filter_payload(p, "redacted")
    assert "hunter22" not in json.dumps(out)
    assert EMAIL not in json.dumps(out)


def test_filter_payload__redacted_masks_top_level_keys() -> None:
    """BUG: at redacted, a top-level key holding an address is masked like a nested key is.

    `_redact` masks the keys of nested mappings, but `filter_payload` copies the top-level keys
    verbatim, so `{"alice@…": …}` keeps the address at redacted (metadata drops such a key).
    """
    out = filter_payload({EMAIL: "x", "nested": {EMAIL: "y"}}, "redacted")
    assert out["nested"] == {MASK: "y"}
    assert EMAIL not in json.dumps(out)


def test_filter_payload__metadata_masks_every_kept_string() -> None:
    """BUG: at metadata, every string that is kept is masked, not only top-level strings.

    Only top-level string values of the summary pass through `mask_secrets`; the tool names
    lifted out of `tool_calls`, the artifact types lifted out of `artifacts`, and strings
    nested in a metadata key's list or dict reach the log at the default level unmasked.
    """
    payloads = [
        {"tool_calls": [{"name": OPENAI_KEY}]},
        {"artifacts": [{"type": EMAIL}]},
        {"tool": [OPENAI_KEY], "attempt": {"note": EMAIL}},
    ]
    for p in payloads:
        dumped = json.dumps(filter_payload(p, "metadata"))
        assert OPENAI_KEY not in dumped
        assert EMAIL not in dumped


def test_filter_payload__returns_new_dict() -> None:
    """Filtering never mutates the caller's payload."""
    p = payload()
    before = json.dumps(p, sort_keys=True)
    for level in PrivacyLevel:
        filter_payload(p, level)
    assert json.dumps(p, sort_keys=True) == before


# -- masking ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "secret",
    [
        OPENAI_KEY,
        "sk-abcdefghijklmnop1234",
        AWS_KEY,
        "ASIAY34FZKBOKMUTVV7A",
        GITHUB_PAT,
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv",
        SLACK_BOT,
        GOOGLE_KEY,
        JWT,
    ],
    ids=["openai", "sk", "aws", "aws-sts", "github", "github-pat", "slack", "google", "jwt"],
)
def test_mask_secrets__api_keys(secret: str) -> None:
    """Known API-key and token shapes are masked wherever they sit in a sentence."""
    assert mask_secrets(f"use {secret} now") == f"use {MASK} now"
    assert mask_secrets(secret) == MASK


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abcdefghijkl123", f"Authorization: Bearer {MASK}"),
        ("authorization: bearer abc.def-ghi_jkl==", f"authorization: bearer {MASK}"),
        ("Basic dXNlcjpwYXNzd29yZA==", f"Basic {MASK}"),
        ("token a1b2c3d4e5f6", f"token {MASK}"),
    ],
)
def test_mask_secrets__bearer_tokens(text: str, expected: str) -> None:
    """Bearer, basic and token credentials are masked, keeping the scheme."""
    assert mask_secrets(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgres://bob:hunter2@db.example.com/app", f"postgres://bob:{MASK}@db.example.com/app"),
        ("https://user:p4ss:w0rd@host/x", f"https://user:{MASK}@host/x"),
        ("redis://:s3cret@cache:6379/0", f"redis://:{MASK}@cache:6379/0"),
        ("amqp+ssl://svc:pw@mq.internal", f"amqp+ssl://svc:{MASK}@mq.internal"),
    ],
)
def test_mask_secrets__url_passwords(text: str, expected: str) -> None:
    """A password in a URL is masked and the user and host are kept."""
    assert mask_secrets(text) == expected


def test_mask_secrets__url_without_password_untouched() -> None:
    """A URL without credentials is not altered."""
    text = "see https://docs.example.com:8443/path?q=1 for details"
    assert mask_secrets(text) == text


@pytest.mark.parametrize(
    "header", ["RSA PRIVATE KEY", "PRIVATE KEY", "OPENSSH PRIVATE KEY", "EC PRIVATE KEY"]
)
def test_mask_secrets__pem_private_keys(header: str) -> None:
    """A whole PEM private-key block is masked, from BEGIN to END."""
    block = f"-----BEGIN {header}-----\nMIIEowIBAAKCAQEAu1SU1Lf\nVLPHCoz\n-----END {header}-----"
    assert mask_secrets(f"key:\n{block}\nthanks") == f"key:\n{MASK}\nthanks"


def test_mask_secrets__unterminated_pem_masked_to_end() -> None:
    """A private key cut off before its END line is masked to the end of the text."""
    assert mask_secrets("here " + PEM.split("-----END", maxsplit=1)[0]) == f"here {MASK}"


def test_mask_secrets__public_certificate_kept() -> None:
    """A public certificate is not a secret and is kept."""
    cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    assert mask_secrets(cert) == cert


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("api_key=abc123 rest", f"api_key={MASK} rest"),
        ("API-KEY: abc123", f"API-KEY: {MASK}"),
        ("client_secret=s3cr3t&grant=x", f"client_secret={MASK}&grant=x"),
        ('{"password": "hunter2", "user": "bob"}', f'{{"password": "{MASK}", "user": "bob"}}'),
        ("passwd=x pwd=y", f"passwd={MASK} pwd={MASK}"),
        ("access_token = 'zzz'", f"access_token = '{MASK}'"),
        ("secret: tops", f"secret: {MASK}"),
        ("auth=abc", f"auth={MASK}"),
    ],
)
def test_mask_secrets__key_value_secrets(text: str, expected: str) -> None:
    """The value of a secret-named key is masked in key=value, key: value and JSON forms."""
    assert mask_secrets(text) == expected


@pytest.mark.parametrize(
    "address",
    ["bob@example.com", "alice.smith+agents@mail.example.co.uk", "x_y-z%1@sub-domain.io"],
)
def test_mask_secrets__email_addresses(address: str) -> None:
    """E-mail addresses are masked."""
    assert mask_secrets(f"write to <{address}>, please") == f"write to <{MASK}>, please"


@pytest.mark.parametrize(
    "text",
    [
        "The quick brown fox jumps over the lazy dog.",
        "skip the task-list for now",
        "version 1.2.3 at example.com",
        "tokens: 1200 used",
        "",
    ],
)
def test_mask_secrets__ordinary_text_untouched(text: str) -> None:
    """Text without secrets or addresses is left as it is."""
    assert mask_secrets(text) == text


def test_redact_string__masks_before_cutting() -> None:
    """Masking happens before the cut, and the cut keeps exactly 2,000 characters."""
    text = "a" * 1990 + " " + EMAIL
    out = redact_string(text)
    assert out == "a" * 1990 + " " + MASK
    long = EMAIL + " " + "b" * 3000
    cut = redact_string(long)
    assert cut.startswith(MASK + " b")
    assert cut.endswith(TRUNCATION_MARK)
    assert len(cut) == MAX_STRING + len(TRUNCATION_MARK)


def test_redact_string__exactly_max_kept() -> None:
    """A string of exactly 2,000 characters is not cut; one more is."""
    assert redact_string("z" * MAX_STRING) == "z" * MAX_STRING
    assert redact_string("z" * (MAX_STRING + 1)) == "z" * MAX_STRING + TRUNCATION_MARK
