"""The tutorial's console pages in a real Chromium, with the tutorial's own agent: the
screenshots docs/tutorial.md shows. Set STEPTRAIL_SCREENSHOTS=docs/img to refresh them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from examples.tutorial import support
from steptrail.domain.enums import RunStatus
from steptrail.testing import Kit, crash_at
from steptrail.workers.registry import App
from tests.browser.conftest import serving
from tests.console_helpers import caught_up

REPO = Path(__file__).resolve().parents[2]
SHOTS = ("tutorial-overview.png", "tutorial-run.png", "tutorial-inbox.png")


@pytest.fixture
def steptrail_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> App:
    """The tutorial's agent, writing its model-calls.log and outbox.txt into tmp_path."""
    monkeypatch.chdir(tmp_path)
    return support.app


def request(customer: str, question: str) -> dict[str, Any]:
    return {"customer": customer, "question": question, "think_seconds": 0}


def test_tutorial_pages__overview_run_and_inbox(
    steptrail_kit: Kit, page: Any, tmp_path: Path
) -> None:
    """The tutorial's story (a crash in the draft, reaped, replayed, approved) and a run
    still waiting appear on the overview, the run's page and the inbox."""
    done = steptrail_kit.run_to_end(
        "support",
        request("ada@example.com", "Where is my order?"),
        decide="approve",
        faults=[crash_at(2)],
        by="you",
    )
    assert done.status is RunStatus.COMPLETED
    assert done.crashes == 1
    waiting = steptrail_kit.run_to_end(
        "support", request("grace@example.com", "Can I change my address?")
    )
    assert waiting.status is RunStatus.WAITING_FOR_APPROVAL
    assert (tmp_path / "outbox.txt").read_text().count("\n") == 1
    rt = steptrail_kit.runtime
    caught_up(rt)
    paths = dict(zip(SHOTS, ("/", f"/runs/{done.run_id}", "/inbox"), strict=True))
    with serving(rt, operator="you") as base:
        for name, path in paths.items():
            page.goto(base + path)
            page.screenshot(path=str(tmp_path / name), full_page=True)
        page.goto(f"{base}/runs/{done.run_id}")
        trail = page.locator("ol.timeline").inner_text()
        page.goto(f"{base}/inbox")
        inbox = page.locator("main").inner_text()
    for event in ("Reclaimed", "Replayed", "Decided", "EffectPending", "Completed"):
        assert event in trail
    assert "send_reply" in inbox
    target = os.environ.get("STEPTRAIL_SCREENSHOTS")
    folder = REPO / target if target else None  # relative to the repository: cwd is tmp_path
    for name in SHOTS:
        png = tmp_path / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(png, folder / name)
