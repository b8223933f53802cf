"""MkDocs hooks of the docs site (ADR 0072).

The four layer folders (`domain/`, `projections/`, `infrastructure/`, `workers/`) are
imported as `steptrail.domain`, … through setuptools' `package-dir` (ADR 0001), a mapping
that griffe, which reads the source for mkdocstrings without importing it, does not follow.
So before a build this hook lays out the installed shape, `steptrail/` with the four layers
inside, as symbolic links in `build/api-src/`, and the handler reads from there. Nothing is
copied, so the reference always shows the source as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STAGE = REPO / "build" / "api-src"
LAYERS = ("domain", "projections", "infrastructure", "workers")


def stage_package() -> Path:
    """`build/api-src/steptrail`: links to `steptrail/`'s entries and to the four layers."""
    package = STAGE / "steptrail"
    package.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in (REPO / "steptrail").iterdir() if p.name != "__pycache__"}
    wanted |= {name: REPO / name for name in LAYERS}
    for link in package.iterdir():
        if link.name not in wanted or not link.is_symlink() or link.resolve() != wanted[link.name]:
            link.unlink()
    for name, target in wanted.items():
        if not (package / name).is_symlink():
            (package / name).symlink_to(target)
    return STAGE


def on_startup(**_: Any) -> None:
    stage_package()


def on_config(config: Any) -> Any:
    stage_package()
    return config
