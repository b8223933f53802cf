"""Hostile input, the pure parts (issue 11): bounds, schemas, actor names, settings, URLs,
inert rendering, logging."""

from __future__ import annotations

import io
import itertools
import logging
from pathlib import Path
from typing import Any

import pytest

from steptrail.domain.actors import check_actor
from steptrail.domain.errors import InvalidActor, InvalidInput, UnreadableEvent
from steptrail.domain.limits import (
    MAX_DEPTH,
    PayloadTooDeep,
    PayloadTooLarge,
    check_depth,
    check_size,
    depth,
)
from steptrail.domain.privacy import filter_schema
from steptrail.domain.run import Run
from steptrail.domain.schemas import InvalidSchema, check_schema, validate_input
from steptrail.infrastructure.codec import CLIPPED, decode_event, encode_event
from steptrail.infrastructure.logging import steptrail_logger
from steptrail.infrastructure.settings import InvalidSettings, Settings
from steptrail.infrastructure.sqlite import target_from_url
from steptrail.render import inert


def nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def clock() -> Any:
    """A monotonic fake clock advancing 1 ms per read."""
    counter = itertools.count()
    return lambda: next(counter) / 1000


# -- limits ----------------------------------------------------------------------------------


def test_depth__iterative_and_stops_early() -> None:
    """Depth counts levels without recursion, even 100,000 deep."""
    assert depth({"a": [1, {"b": []}]}) == 4
    assert depth("text") == 0
    assert depth(nested(100_000)) == MAX_DEPTH + 1


def test_check_depth_and_size__typed_errors() -> None:
    """Too deep and too large each raise their own PayloadRejected subclass."""
    check_depth(nested(MAX_DEPTH), "x")
    with pytest.raises(PayloadTooDeep, match="more than 64 levels"):
        check_depth(nested(MAX_DEPTH + 1), "x")
    with pytest.raises(PayloadTooLarge, match="limit is 10 bytes"):
        check_size(11, 10, "x")


# -- reading back ----------------------------------------------------------------------------


def test_decode__too_deep_for_the_fast_path_is_clipped() -> None:
    """An event deeper than pydantic-core parses decodes with its content cut at the bound."""
    event = Run.StepRecorded(
        actor="w", seq=1, kind="llm", name="s", duration_ms=1, payload={"c": nested(250)}
    )
    topic, state = encode_event(event)
    decoded = decode_event(topic, state, where="event 3 of run r")
    assert isinstance(decoded, Run.StepRecorded)
    assert decoded.seq == 1
    assert CLIPPED in str(decoded.payload)
    assert depth(decoded.payload) <= MAX_DEPTH


def test_decode__garbage_names_the_row() -> None:
    """Bytes that are not JSON raise UnreadableEvent naming where they were, and never quote
    the stored content."""
    topic, _ = encode_event(Run.LeaseRenewed(actor="w"))
    with pytest.raises(UnreadableEvent, match="event 7 of run r") as raised:
        decode_event(topic, b'{"actor": SECRET', where="event 7 of run r")
    assert "SECRET" not in str(raised.value)


# -- schemas ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"$ref": "file:///etc/passwd"}, "only local references"),
        ({"properties": {"a": {"$ref": "http://127.0.0.1:1/x"}}}, "only local references"),
        ({"$defs": {"a": {"$dynamicRef": "https://x/y#a"}}}, "only local references"),
        ({"type": "nope"}, "invalid"),
        ({"pattern": "("}, "invalid pattern"),
        ({"$schema": "http://example.com/my-dialect"}, "unknown JSON Schema dialect"),
        (["not", "an", "object"], "JSON object"),
        ({"allOf": nested(80)}, "more than 64 levels"),
        ({"description": "x" * 70_000}, "limit is 65,536"),
        (
            {"patternProperties": {"^a": {}}, "unevaluatedProperties": False},
            "may not combine",
        ),
    ],
)
def test_check_schema__refused(schema: Any, why: str) -> None:
    """Invalid, non-local, oversized or unboundable schemas are refused when declared."""
    with pytest.raises(InvalidSchema, match=why):
        check_schema(schema)


def test_validate_input__local_refs_work_and_nothing_is_retrieved() -> None:
    """Local `$ref`s resolve; the registry retrieves nothing."""
    schema = {
        "type": "object",
        "$defs": {"acct": {"type": "string", "minLength": 2}},
        "properties": {"a": {"$ref": "#/$defs/acct"}},
        "required": ["a"],
    }
    assert validate_input(schema, {"a": "ok", "extra": 1}, clock=clock()) == {"a": "ok"}
    with pytest.raises(InvalidInput, match="a: 'x' is too short"):
        validate_input(schema, {"a": "x"}, clock=clock())


def test_validate_input__refused_schema_is_invalid_input() -> None:
    """A run that declared a refused schema before the check existed gets a clear error."""
    with pytest.raises(InvalidInput, match="refuses"):
        validate_input({"$ref": "file:///etc/passwd"}, {}, clock=clock())


def test_validate_input__catastrophic_pattern_times_out() -> None:
    """Backtracking blow-ups stop at the budget, in `pattern`, `patternProperties` and the
    additionalProperties that depends on them."""
    evil = "^(a|a)*$"
    hostile = "a" * 40 + "!"
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"properties": {"v": {"pattern": evil}}}, {"v": hostile}),
        ({"patternProperties": {evil: {"type": "string"}}}, {hostile: "x"}),
        ({"patternProperties": {evil: {}}, "additionalProperties": False}, {hostile: 1}),
        ({"propertyNames": {"pattern": evil}}, {hostile: 1}),
    ]
    import time

    for schema, values in cases:
        started = time.monotonic()
        with pytest.raises(InvalidInput, match=r"took over 0\.2 s"):
            validate_input(schema, values, clock=time.monotonic, budget_s=0.2)
        assert time.monotonic() - started < 5


def test_validate_input__self_reference_refused() -> None:
    """A schema that refers to itself without end is refused, not a RecursionError."""
    with pytest.raises(InvalidInput):
        validate_input({"$ref": "#"}, {"a": 1}, clock=clock())


def test_validate_input__unique_items_linear_and_json_equality() -> None:
    """uniqueItems treats 1 and 1.0 as equal, true and 1 as different."""
    schema = {"properties": {"v": {"type": "array", "uniqueItems": True}}}
    validate_input(schema, {"v": [True, 1, {"a": 1}, {"a": 2}]}, clock=clock())
    with pytest.raises(InvalidInput, match="non-unique"):
        validate_input(schema, {"v": [1, 1.0]}, clock=clock())
    validate_input(schema, {"v": list(range(200_000))}, clock=lambda: 0.0)


# -- actor names -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["alice", "Zoë O'Neil (ops)", "bob@example.com", "ops/oncall #2"])
def test_check_actor__accepted(name: str) -> None:
    """Ordinary names, in any script, with common punctuation, are accepted as given."""
    assert check_actor(name) == name


@pytest.mark.parametrize(
    "name", ["", " ", "[red]x[/]", "a\x1bb", "a\u202eb", "a\u200bb", "x" * 201, " a", "a\n"]
)
def test_check_actor__refused(name: str) -> None:
    """Empty, markup, escapes, invisible or direction characters, too long, padded: refused."""
    with pytest.raises(InvalidActor):
        check_actor(name)


# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "variable"),
    [
        ("lease_seconds", "inf", "STEPTRAIL_LEASE_SECONDS"),
        ("lease_seconds", 1e300, "STEPTRAIL_LEASE_SECONDS"),
        ("lease_seconds", 0, "STEPTRAIL_LEASE_SECONDS"),
        ("retry_base_seconds", float("inf"), "STEPTRAIL_RETRY_BASE_SECONDS"),
        ("retry_jitter", 2, "STEPTRAIL_RETRY_JITTER"),
        ("max_requeues", 2.5, "STEPTRAIL_MAX_REQUEUES"),
        ("retention_days", "99999999999", "STEPTRAIL_RETENTION_DAYS"),
        ("database_url", "  ", "STEPTRAIL_DATABASE_URL"),
    ],
)
def test_settings__out_of_range_names_variable(field: str, value: Any, variable: str) -> None:
    """Every number is finite and bounded; the error names the variable and its range."""
    with pytest.raises(InvalidSettings, match=variable) as raised:
        Settings(**{field: value})
    assert "must" in str(raised.value)


def test_settings__fallbacks_kept() -> None:
    """The reference fallbacks still hold: an invalid retention window means 30 days."""
    with pytest.warns(UserWarning, match="RETENTION_DAYS"):
        settings = Settings(retention_days="abc")
    assert settings.retention_days == 30
    with pytest.warns(UserWarning, match="RETENTION_DAYS"):
        settings = Settings(retention_days="0")
    assert settings.retention_days == 30
    assert Settings(lease_seconds="2.5").lease_seconds == 2.5


# -- database URLs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("sqlite://", "names no database file"),
        ("sqlite:///", "names no database file"),
        ("sqlite:////etc/passwd", "system folder /etc"),
        ("sqlite:////proc/self/environ", "system folder /proc"),
        ("sqlite:///x.db?mode=rwc", r"only \?mode=ro"),
        ("sqlite://host/x.db", "no host"),
    ],
)
def test_sqlite_url__refused(url: str, why: str) -> None:
    """URLs that would silently use memory, a system file or an unknown option are refused."""
    with pytest.raises(ValueError, match=why):
        target_from_url(url)


def test_sqlite_url__read_only_and_memory(tmp_path: Path) -> None:
    """`?mode=ro` opens read-only; `:memory:` stays available explicitly."""
    path = tmp_path / "a.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    target = target_from_url(f"sqlite:///{path}?mode=ro")
    assert target.read_only
    assert target.db_name.startswith("file:")
    assert target.db_name.endswith("?mode=ro")
    assert not target_from_url(f"sqlite:///{path}").read_only
    assert target_from_url("sqlite:///:memory:").path is None


# -- output ----------------------------------------------------------------------------------


def test_inert__markup_and_controls_escaped() -> None:
    """Markup prints literally and control characters become visible escapes."""
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    console.print(inert("[bold red]x[/] \x1b[2J\u202e end"), highlight=False)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "[bold red]x[/]" in text
    assert "\\x1b" in text
    assert "\\u202e" in text
    assert "\x1b[2J" not in text


# -- privacy ---------------------------------------------------------------------------------


def test_filter_schema__free_text_only_at_full() -> None:
    """Titles and descriptions stay out of the log below `full`; redacted masks secrets."""
    schema = {
        "description": "call bob@example.com",
        "properties": {"a": {"title": "CANARY"}},
    }
    kept = filter_schema(schema, "metadata")
    assert "CANARY" not in str(kept)
    assert kept["properties"] == ["a"]
    assert kept["schema_digest"].startswith("sha256:")
    assert "bob@example.com" not in str(filter_schema(schema, "redacted"))
    assert filter_schema(schema, "full") == schema


# -- logging ---------------------------------------------------------------------------------


def test_logger__goes_through_stdlib_logging(caplog: pytest.LogCaptureFixture) -> None:
    """steptrail's logger hands records to the stdlib `steptrail` logger, honouring its
    level, and never prints by itself."""
    log = steptrail_logger()
    logger = logging.getLogger("steptrail")
    old = logger.level, logger.propagate
    logger.propagate = True
    try:
        logger.setLevel(logging.WARNING)
        with caplog.at_level(logging.WARNING, logger="steptrail"):
            log.info("run_enqueued", run_id="r")
            log.warning("lease_lost", run_id="r")
        names = [r.msg["event"] for r in caplog.records if isinstance(r.msg, dict)]
        assert set(names) == {"lease_lost"}
    finally:
        logger.setLevel(old[0])
        logger.propagate = old[1]


def test_logger__level_read_on_every_call(caplog: pytest.LogCaptureFixture) -> None:
    """A bound logger skips debug and info while the stdlib level is above them (without
    building the event, ADR 0053), and logs them once the level is lowered: the level is
    asked on each call, never remembered."""
    log = steptrail_logger().bind(worker_id="w")
    logger = logging.getLogger("steptrail")
    old = logger.level, logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.DEBUG, logger="steptrail"):
            logger.setLevel(logging.WARNING)
            log.debug("hidden_debug")
            log.info("hidden_info", run_id="r")
            logger.setLevel(logging.INFO)
            log.debug("hidden_debug_2")
            log.info("shown_info", run_id="r")
            logger.setLevel(logging.DEBUG)
            log.bind(version=2).debug("shown_debug")
            # The real structlog logger exists now: its own methods ask the level too.
            logger.setLevel(logging.WARNING)
            log.info("hidden_info_2")
            log.bind(version=3).debug("hidden_debug_3")
            log.warning("shown_warning")
            logger.setLevel(logging.INFO)
            log.bind(version=4).info("shown_info_2")
        # (caplog may see a record twice: on `steptrail` and where it propagates to)
        events = {r.msg["event"]: r.msg for r in caplog.records if isinstance(r.msg, dict)}
        assert list(events) == ["shown_info", "shown_debug", "shown_warning", "shown_info_2"]
        assert events["shown_info_2"]["version"] == 4
        assert events["shown_info"]["worker_id"] == "w"
        assert events["shown_debug"]["version"] == 2
    finally:
        logger.setLevel(old[0])
        logger.propagate = old[1]


def test_logger__a_kept_level_method_honours_logging_disable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The level method a bound logger keeps (ADR 0084) asks the level the way structlog's
    `filter_by_level` does: `logging.disable` drops its events too, and lifting it lets the
    same logger's next event through."""
    log = steptrail_logger().bind(worker_id="w")
    logger = logging.getLogger("steptrail")
    old = logger.level, logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger="steptrail"):
            logger.setLevel(logging.INFO)
            logging.disable(logging.INFO)
            log.info("hidden_info", run_id="r")
            logging.disable(logging.NOTSET)
            log.info("shown_info", run_id="r")
        events = {r.msg["event"] for r in caplog.records if isinstance(r.msg, dict)}
        assert events == {"shown_info"}
    finally:
        logging.disable(logging.NOTSET)
        logger.setLevel(old[0])
        logger.propagate = old[1]


def test_tool_label__free_text_names_only_at_redacted_and_full() -> None:
    """A declared tool keeps its name; an undeclared one is a stable digest label below
    `redacted`, masked at `redacted`, verbatim at `full`."""
    from steptrail.domain.privacy import filter_payload, tool_label

    declared = frozenset({"send_email"})
    assert tool_label("send_email", "metadata", declared) == "send_email"
    label = tool_label("wire $5000 to acct 12345", "metadata", declared)
    assert label.startswith("undeclared:")
    assert label == tool_label("wire $5000 to acct 12345", "none", declared)
    assert "12345" not in label
    assert tool_label("token=abcdefgh1234", "redacted", declared) == "token=***"
    assert tool_label("anything", "full", declared) == "anything"
    summary = filter_payload(
        {"tool": "CANARY", "tool_calls": [{"name": "CANARY"}, {"name": "send_email"}]},
        "metadata",
        declared_tools=declared,
    )
    assert "CANARY" not in str(summary)
    assert summary["requested_tool_names"][1] == "send_email"
