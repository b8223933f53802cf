"""The testing guide's example runs as written, as a user would run it: the file the guide
includes (examples/testing/test_booking.py, once the README's block) is copied to a folder
and collected by a separate pytest, through the installed plugin."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PG_ADMIN_URL

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "testing" / "test_booking.py"
GUIDE = REPO / "docs" / "guides" / "testing.md"


def readme_example() -> str:
    """The testing kit's example file, which the testing guide includes."""
    assert '--8<-- "examples/testing/test_booking.py"' in GUIDE.read_text()
    return EXAMPLE.read_text()


def test_readme_example__is_a_test_file_with_the_promised_parts() -> None:
    """The example has a write tool, an approval and tests that use the kit."""
    code = readme_example()
    assert 'effect="non_idempotent_write"' in code
    assert "ctx.request_approval" in code
    assert len(re.findall(r"^def test_", code, re.M)) >= 3


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_readme_example__passes_under_pytest(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Every test of the README example passes, on a fresh SQLite file or on PostgreSQL."""
    (tmp_path / "test_booking.py").write_text(readme_example())
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_booking.py"]
    if backend == "postgres":
        request.getfixturevalue("pg_database")  # PostgreSQL must be there (fails under CI)
        args += ["--steptrail-database-url", PG_ADMIN_URL]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    done = subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b4 passed\b", done.stdout), done.stdout
