"""The console's pure parts: bind and CSRF rules, the JSON-Schema form, and the SVG charts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

pytest.importorskip("markupsafe", reason="the console extra is not installed")

from steptrail.console import charts
from steptrail.console.forms import fields_for, values_from
from steptrail.console.security import ConsoleRefused, check_bind, csrf_ok, is_loopback
from steptrail.domain.errors import InvalidInput
from steptrail.infrastructure.reporting_store import PageKey

SCHEMA = {
    "type": "object",
    "properties": {
        "account": {"type": "string"},
        "seats": {"type": "integer"},
        "ratio": {"type": "number"},
        "urgent": {"type": "boolean"},
        "plan": {"type": "string", "enum": ["basic", "pro"]},
        "tags": {"type": "array"},
    },
    "required": ["account"],
}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.0.2.10", False),
        ("console.example", False),
    ],
)
def test_is_loopback__only_this_machine(host: str, loopback: bool) -> None:
    """Loopback addresses and `localhost` are local; the wildcard and names are not."""
    assert is_loopback(host) is loopback


def test_check_bind__public_address_needs_a_token() -> None:
    """A non-loopback bind without a token (or with a short one) is refused; loopback is not."""
    check_bind("127.0.0.1", None)
    with pytest.raises(ConsoleRefused, match="STEPTRAIL_CONSOLE_TOKEN"):
        check_bind("0.0.0.0", None)
    with pytest.raises(ConsoleRefused, match="16 characters"):
        check_bind("0.0.0.0", "short")
    check_bind("0.0.0.0", "a-long-enough-token")


def test_csrf_ok__double_submit_and_origin() -> None:
    """The form must echo the cookie, and a sent Origin must be this host."""
    assert csrf_ok("abc", "abc", None, "127.0.0.1:8765")
    assert csrf_ok("abc", "abc", "http://127.0.0.1:8765", "127.0.0.1:8765")
    assert not csrf_ok("abc", "abd", None, "127.0.0.1:8765")
    assert not csrf_ok(None, None, None, "127.0.0.1:8765")
    assert not csrf_ok("abc", "abc", "null", "127.0.0.1:8765")
    assert not csrf_ok("abc", "abc", "https://evil.example", "127.0.0.1:8765")


def test_fields_for__one_widget_per_property() -> None:
    """Strings, numbers, booleans and enums get their widget; the rest a JSON area."""
    widgets = {f.name: (f.widget, f.required) for f in fields_for(SCHEMA)}
    assert widgets == {
        "account": ("text", True),
        "seats": ("integer", False),
        "ratio": ("number", False),
        "urgent": ("checkbox", False),
        "plan": ("select", False),
        "tags": ("json", False),
    }


def test_values_from__typed_values_and_clear_errors() -> None:
    """Form text becomes typed values; an empty optional field is left out; bad numbers
    and bad JSON raise InvalidInput."""
    fields = fields_for(SCHEMA)
    form = {"v.account": "acme", "v.seats": "3", "v.ratio": "", "v.tags": '["a"]'}
    assert values_from(fields, form) == {
        "account": "acme",
        "seats": 3,
        "urgent": False,
        "tags": ["a"],
    }
    with pytest.raises(InvalidInput, match="seats"):
        values_from(fields, {"v.account": "a", "v.seats": "three"})
    with pytest.raises(InvalidInput, match="tags"):
        values_from(fields, {"v.account": "a", "v.tags": "{"})


def test_values_from__a_schema_without_properties_takes_one_json_object() -> None:
    """An opaque schema gets a single JSON field that must hold an object."""
    fields = fields_for({"type": "object"})
    assert values_from(fields, {"v.": '{"x": 1}'}) == {"x": 1}
    with pytest.raises(InvalidInput):
        values_from(fields, {"v.": "[1]"})


def test_charts__labels_are_escaped_and_bars_scale() -> None:
    """Series names reach the SVG escaped; the tallest bar spans the plot height."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    times = [t0 + timedelta(minutes=i) for i in range(3)]
    svg = charts.stacked_bars(times, {"<b>": [1, 2, 4]}, label="x<y")
    assert "<b>" not in svg
    assert "&lt;b&gt;" in svg
    assert 'aria-label="x&lt;y"' in svg
    assert f'height="{charts.HEIGHT - charts.PAD_B - charts.PAD_T:.1f}"' in svg
    assert "no data yet" in charts.lines([], {}, label="empty")


def test_percentile__nearest_rank() -> None:
    """p50 and p99 of 1..100 are 50-ish and 99-ish; none gives 0."""
    values = list(range(1, 101))
    assert charts.percentile(values, 0.5) in (50.0, 51.0)
    assert charts.percentile(values, 0.99) == 99.0
    assert charts.percentile([], 0.5) == 0.0


def test_page_key__round_trips_and_rejects_garbage() -> None:
    """A page key survives its URL form to the microsecond; anything else is refused."""
    key = PageKey(datetime(2026, 5, 4, 3, 2, 1, 123456, tzinfo=UTC), None)
    from uuid import uuid4

    key = PageKey(key.created_at, uuid4())
    assert PageKey.decode(key.encode()) == key
    for bad in ("", "x.y", "123.abc", "12.34.56"):
        with pytest.raises(ValueError, match="page key"):
            PageKey.decode(bad)


def test_import__steptrail_does_not_import_the_console() -> None:
    """The core install stays small: `import steptrail` loads no web framework."""
    import subprocess
    import sys

    web = "{'starlette', 'jinja2', 'uvicorn'}"
    code = f"import sys, steptrail; print(sorted({web} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
