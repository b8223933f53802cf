"""Named SQL queries, kept per backend in `sql/<backend>/queries.sql` and loaded by name.

A file is a sequence of blocks, each starting with a `-- name: <query_name>` line; the
comment lines that follow explain the query and are kept with it. Both backends must define
the same names (a test checks), and a query whose SQLite form differs says why beside it.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """{name: sql} of a queries file."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip().rstrip(";").strip()
    return queries


def statements(script: str) -> list[str]:
    """The statements of a script, split at semicolons that end a line (no statement of ours
    has a semicolon inside a literal); comment-only lines are dropped."""
    out: list[str] = []
    buffer: list[str] = []
    for line in script.splitlines():
        if line.lstrip().startswith("--"):
            continue
        buffer.append(line)
        if line.rstrip().endswith(";"):
            out.append("\n".join(buffer).strip().rstrip(";").strip())
            buffer = []
    rest = "\n".join(buffer).strip()
    if rest:
        out.append(rest.rstrip(";").strip())
    return [s for s in out if s]


@cache
def queries(backend: str) -> dict[str, str]:
    """The named queries of `backend` ("postgres" or "sqlite")."""
    text = (
        resources.files("steptrail.infrastructure")
        .joinpath("sql", backend, "queries.sql")
        .read_text("utf-8")
    )
    return parse(text)


@cache
def migrations(backend: str) -> list[tuple[int, str, str]]:
    """(number, name, sql) of every migration of `backend`, in order."""
    folder = resources.files("steptrail.infrastructure").joinpath("sql", backend, "migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    return sorted(found)
