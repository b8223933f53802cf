"""The layers point inward (ADR 0001), checked by parsing every module's imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "domain": {
        "psycopg",
        "psycopg_pool",
        "sqlite3",
        "structlog",
        "eventsourcing",
        "time",
        "socket",
        "os",
        "threading",
        "steptrail.infrastructure",
        "steptrail.workers",
        "steptrail.projections",
        "steptrail.runtime",
        "steptrail.cli",
    },
    "projections": {
        "psycopg",
        "sqlite3",
        "eventsourcing",
        "structlog",
        "steptrail.infrastructure",
        "steptrail.workers",
        "steptrail.runtime",
    },
    "infrastructure": {"steptrail.workers", "steptrail.runtime", "steptrail.cli"},
    "workers": {
        "psycopg",
        "psycopg_pool",
        "sqlite3",
        "eventsourcing",
        "steptrail.infrastructure",
        "steptrail.runtime",
        "steptrail.cli",
    },
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer__imports_only_inward(layer: str) -> None:
    """No module of a layer imports what its layer may not touch."""
    offences = []
    for path in sorted((REPO / layer).rglob("*.py")):
        for name in imports(path):
            for banned in FORBIDDEN[layer]:
                if name == banned or name.startswith(banned + "."):
                    offences.append(f"{path.relative_to(REPO)} imports {name}")
    assert offences == []


def test_domain__reads_no_clock() -> None:
    """The domain never reads a clock: time is an argument or the store's."""
    for path in (REPO / "domain").rglob("*.py"):
        text = path.read_text()
        for call in ("datetime.now", "time.time(", "time.monotonic(", "date.today"):
            assert call not in text, f"{path.name} reads the clock via {call}"


def test_core__imports_no_agent_framework() -> None:
    """Only `steptrail/integrations/` imports an agent framework: the core install stays
    small and `import steptrail` works without any extra."""
    frameworks = ("pydantic_ai", "langgraph", "langchain_core", "agents")
    offences = []
    for folder in ("domain", "projections", "infrastructure", "workers", "steptrail"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if "integrations" in path.relative_to(REPO).parts:
                continue
            for name in imports(path):
                if name.split(".")[0] in frameworks:
                    offences.append(f"{path.relative_to(REPO)} imports {name}")
    assert offences == []
