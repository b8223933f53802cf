"""Every code example of the docs site and the README runs: Python blocks are files under
examples/ (included by pymdownx.snippets, run here), and every `steptrail …` line of a shell
block names a real command and real options (ADR 0072)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from steptrail.cli import cli

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
EXAMPLES = REPO / "examples"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.M | re.S)
INCLUDE = re.compile(r'^--8<-- "([^":]+)(?::(\w+))?"$')
# Run as modules here; the testing kit's test file runs under pytest in
# tests/acceptance/test_readme_testing_example.py, the tutorial's session in test_tutorial.py,
# the projection in tests/integration/test_projections.py.
RUNNABLE = sorted(
    p.stem for p in EXAMPLES.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()
)


def pages() -> list[Path]:
    """Every hand-written page (the ADRs are prose; the reference is generated)."""
    return [
        p
        for p in sorted(DOCS.rglob("*.md"))
        if "adr" not in p.relative_to(DOCS).parts and "reference" not in p.relative_to(DOCS).parts
    ]


def blocks(path: Path, *languages: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang in languages]


def test_pages__every_python_block_is_an_included_example() -> None:
    """No Python code is written inline on a page: each block includes a file (or a
    marked section of one) under examples/, which exists."""
    included = 0
    for path in pages():
        for body in blocks(path, "python", "py"):
            for line in body.strip().splitlines():
                match = INCLUDE.match(line)
                assert match, f"{path.relative_to(REPO)}: inline code {line!r}"
                source = REPO / match.group(1)
                assert source.is_relative_to(EXAMPLES), line
                assert source.exists(), line
                if match.group(2):
                    assert f"--8<-- [start:{match.group(2)}]" in source.read_text(), line
                included += 1
    assert included >= 10


def test_pages__every_shell_include_names_a_section_that_exists() -> None:
    """Shell blocks that include the tutorial's session name sections it has."""
    for path in pages():
        for body in blocks(path, "bash"):
            for line in body.splitlines():
                match = INCLUDE.match(line.strip())
                if match:
                    source = (REPO / match.group(1)).read_text()
                    assert f"--8<-- [start:{match.group(2)}]" in source, line


@pytest.mark.parametrize("name", RUNNABLE)
def test_example__runs_to_completion(name: str, tmp_path: Path) -> None:
    """`python -m examples.NAME` in an empty folder (a fresh SQLite database) exits 0 and
    its run completed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env |= {"PYTHONPATH": str(REPO), "STEPTRAIL_LOG_LEVEL": "warning"}
    done = subprocess.run(
        [sys.executable, "-m", f"examples.{name}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "completed" in done.stdout, done.stdout  # each example prints its run(s) at the end


def test_readme__example_is_examples_quickstart_verbatim() -> None:
    """The README's Python example is examples/quickstart.py without its docstring, so
    the example the tests run is the one the README shows."""
    readme = (REPO / "README.md").read_text()
    source = (EXAMPLES / "quickstart.py").read_text()
    body = source.split('"""', 2)[2].strip()
    assert [b.strip() for b in blocks(REPO / "README.md", "python")] == [body]
    assert len(body.splitlines()) <= 35
    assert "```python" in readme


def steptrail_commands(text: str) -> list[list[str]]:
    """Each `steptrail …` invocation in a shell block, as its words."""
    found = []
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        for part in re.split(r"&&|\|\||;|\||\$\(|\)|&(?!&)", line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                continue
            while words and (re.match(r"^[A-Z_]+=", words[0]) or words[0] in {"export", "sleep"}):
                words = words[1:] if words[0] != "sleep" else []
            if words and words[0] in {"steptrail", ".venv/bin/steptrail"}:
                found.append(words[1:])
    return found


def shell_sources() -> list[Path]:
    return [*pages(), REPO / "README.md", EXAMPLES / "tutorial" / "session.sh"]


def test_shell_blocks__every_steptrail_line_names_real_commands_and_options() -> None:
    """Every `steptrail` line in a shell block (and the tutorial's session) names a command
    that exists, with options that command has: a renamed option breaks this test."""
    group = typer.main.get_command(cli)
    commands = group.commands  # type: ignore[attr-defined]
    global_options = {o for p in group.params for o in p.opts}
    checked = 0
    for path in shell_sources():
        text = path.read_text() if path.suffix == ".sh" else "\n".join(blocks(path, "bash"))
        for invocation in steptrail_commands(text):
            words = invocation
            while words and words[0] in global_options:
                words = words[2:]
            assert words, f"{path.name}: a steptrail line without a command"
            name, rest = words[0], words[1:]
            assert name in commands, f"{path.name}: no command {name!r}"
            command = commands[name]
            subcommands = getattr(command, "commands", {})  # a group: `schedules pause …`
            if rest and rest[0] in subcommands:
                command, rest = subcommands[rest[0]], rest[1:]
            known = {
                o for p in command.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]
            } | {"--help"}
            for word in rest:
                if word.startswith("-") and word not in {"-"}:
                    assert word.split("=", 1)[0] in known, f"{path.name}: {name} has no {word}"
            checked += 1
    assert checked >= 30
