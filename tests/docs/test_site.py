"""The docs site builds in strict mode and its generated reference matches the code: every
public name, command, option, setting, event and ADR appears in it (ADR 0072)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import steptrail
import steptrail.events
from steptrail.infrastructure.settings import Settings, variable
from tests.conftest import IN_CI

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
REFERENCE = DOCS / "reference"
LIBRARY = ("steptrail", "domain", "infrastructure", "projections", "workers")


def docs_extra() -> None:
    """Skip without the docs extra, with a reason; under CI=true (scripts/test installs it)
    fail instead."""
    if importlib.util.find_spec("mkdocs") is None:
        why = "the docs extra is not installed (pip install -e '.[docs]')"
        if IN_CI:
            pytest.fail(f"under CI=true the site must build: {why}")
        pytest.skip(why)


def generator() -> ModuleType:
    """docs/gen_reference.py, imported as a module."""
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page(name: str) -> str:
    return (REFERENCE / name).read_text()


def section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same level."""
    start = text.index(heading)
    level = heading.split(" ", 1)[0]
    after = text.find(f"\n{level} ", start + len(heading))
    return text[start : after if after != -1 else len(text)]


def test_reference__pages_are_what_the_generator_writes_now() -> None:
    """docs/reference/ is up to date: `gen_reference.py --check` finds nothing stale."""
    done = subprocess.run(
        [sys.executable, str(DOCS / "gen_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_reference__api_names_every_public_name() -> None:
    """Every name in `steptrail.__all__` and `steptrail.events.__all__` has an entry, and
    nothing else does."""
    text = page("api.md")
    top = set(re.findall(r"^### `steptrail\.(\w+)`$", text, re.M))
    events = set(re.findall(r"^### `steptrail\.events\.(\w+)`$", text, re.M))
    assert top == set(steptrail.__all__)
    assert events == set(steptrail.events.__all__)


def test_reference__cli_names_every_command_and_option() -> None:
    """Every command of the Typer app has a section naming each of its options and
    arguments; the global options are there too."""
    commands = generator().cli_commands()
    text = page("cli.md")
    for param in commands.pop("").params:
        assert f"`{param.opts[0]}`" in section(text, "## Global options")
    assert len(commands) >= 20
    for name, command in commands.items():
        body = section(text, f"### `{name}`")
        for param in command.params:
            shown = (
                (param.metavar or param.name).upper()
                if param.param_type_name == "argument"
                else param.opts[0]
            )
            assert f"`{shown}`" in body, f"{name}: {shown} missing"


def test_reference__settings_names_every_setting_and_variable() -> None:
    """Every field of `Settings` appears with its environment variable, and every
    `STEPTRAIL_*` name the library reads is a setting or listed as another variable."""
    text = page("settings.md")
    for field in Settings.model_fields:
        assert f"| `{variable(field)}` | `{field}` |" in text
    read = set()
    for folder in LIBRARY:
        for path in (REPO / folder).rglob("*.py"):
            read |= set(re.findall(r"STEPTRAIL_[A-Z][A-Z_]+", path.read_text()))
    for name in read:
        assert f"`{name}`" in text, f"{name} is read by the library but not documented"


def test_reference__events_lists_every_event_with_topic_and_fields() -> None:
    """Each event class has a section with its stored topic, version and every field."""
    text = page("events.md")
    for name, cls in generator().event_classes().items():
        body = section(text, f"## `{name}`")
        if cls.TOPIC:
            assert f"Topic `{cls.TOPIC}`, version {cls.VERSION}." in body
        for field in cls.model_fields:
            assert f"| `{field}` |" in body, f"{name}.{field} missing"


def test_reference__telemetry_lists_every_metric_and_span_attribute() -> None:
    """Every worker and view metric, and every span attribute the tracing module sets."""
    text = page("telemetry.md")
    from steptrail.worker_metrics import METRIC_NAMES

    for name in METRIC_NAMES:
        assert f"`{name}`" in text
    for name in ("steptrail_runs", "steptrail_stale_leases", "steptrail_projection_lag_events"):
        assert f"`{name}`" in text
    for name in generator().span_attributes():
        assert f"`{name.rstrip('.')}" in text


def test_reference__adr_index_links_every_adr() -> None:
    """Each docs/adr/NNNN-*.md file is linked from the index, in number order."""
    text = page("adr.md")
    files = sorted(p.name for p in (DOCS / "adr").glob("[0-9]*.md"))
    assert re.findall(r"\(\.\./adr/([^)]+)\)", text) == files


def nav_pages(nav: list[object]) -> list[str]:
    found: list[str] = []
    for item in nav:
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                found += nav_pages(value) if isinstance(value, list) else [str(value)]
    return found


def test_nav__every_page_but_the_adrs_is_in_the_nav() -> None:
    """No page is orphaned: every Markdown file under docs/ except the ADRs (reached from
    the generated index) is in mkdocs.yml's nav, and every nav entry exists."""
    docs_extra()
    import yaml  # PyYAML comes with MkDocs

    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml names a Python function for the Mermaid fence; the nav needs none of it.
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=Loader)  # noqa: S506
    listed = nav_pages(config["nav"])
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if p.parts[-2] != "adr"}
    assert sorted(pages) == sorted(listed)


def test_site__builds_in_strict_mode(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds with no warning: no broken link or anchor, no
    missing include, no docstring the API reference cannot read."""
    docs_extra()
    mkdocs = Path(sys.executable).with_name("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    tutorial = (tmp_path / "site" / "tutorial" / "index.html").read_text()
    assert "--8&lt;--" not in tutorial, "a snippet was not included"
    assert "tutorial-run.png" in tutorial


def test_readme__every_relative_link_reaches_a_file() -> None:
    """The README is not built into the site, so its links are checked here: each relative
    link names a file or folder of the repository (and an anchor, a heading of that page)."""
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([\w-]+))?\)", readme)
    assert len(links) >= 20
    for target, anchor in links:
        if "://" in target:
            continue
        path = REPO / target
        assert path.exists(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"{target}#{anchor}"
