"""The console in a real headless Chromium: what an operator clicks, checked in the log.

The action tests run on both backends; each checks the run's event trail afterwards, not
only the page. Set STEPTRAIL_SCREENSHOTS=docs/img to refresh the console guide's screenshots.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steptrail.domain.enums import RunStatus
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
from tests.browser.conftest import serving
from tests.conftest import make_runtime
from tests.console_helpers import (
    APPROVAL,
    DEAD,
    HOSTILE,
    INPUT,
    caught_up,
    hostile_app,
    settle,
    topics,
)


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    runtime = make_runtime(db_url, app=hostile_app())
    yield runtime
    runtime.close()


def act_as(page: Any, base: str, name: str) -> None:
    """Set the operator's name in the header, as a person would."""
    page.goto(f"{base}/")
    page.fill("header input[name=name]", name)
    page.click("header button[type=submit]")
    page.wait_for_url(re.compile(r"done=operator"))


def decisions(rt: Runtime, run_id: Any) -> list[Run.Decided]:
    return [h.event for h in rt.history(run_id) if isinstance(h.event, Run.Decided)]


def test_runs__list_filter_and_open_a_run(rt: Runtime, page: Any) -> None:
    """The list shows runs with counts; the failed tab and the agent filter narrow it; a run
    opens with its trail, and a version link shows the state then."""
    done = settle(rt, {"steps": 2})
    dead = settle(rt, DEAD)
    with serving(rt) as base:
        page.goto(f"{base}/runs")
        rows = page.locator("table.runs tbody tr[data-run]")
        assert rows.count() == 2
        assert page.locator("a.tab[data-status=failed] b").inner_text() == "1"
        page.click("a.tab[data-status=failed]")
        page.wait_for_url(re.compile(r"status=failed"))
        assert page.locator("table.runs tbody tr[data-run]").count() == 1
        assert page.locator(f"tr[data-run='{dead}']").count() == 1
        page.click("a.tab >> text=all")
        page.select_option("form.filters select[name=agent]", "scripted")
        page.select_option("form.filters select[name=reason]", "completed")
        page.click("form.filters button[type=submit]")
        page.wait_for_url(re.compile(r"reason=completed"))
        assert page.locator("table.runs tbody tr[data-run]").count() == 1
        page.click(f"tr[data-run='{done}'] a")
        page.wait_for_url(f"{base}/runs/{done}")
        names = page.locator("ol.timeline .name").all_inner_texts()
        assert names == topics(rt, done)
        page.click("ol.timeline li[data-version='2'] a.v")
        page.wait_for_url(re.compile(r"version=2"))
        assert "State at version 2" in page.locator("#state h2").inner_text()
        assert '"status": "running"' in page.locator("#state pre").inner_text()


def test_inbox__approve_with_the_shown_digest(rt: Runtime, page: Any) -> None:
    """Approving in the inbox records a decision bound to the digest the page showed."""
    run_id = settle(rt, APPROVAL)
    with serving(rt) as base:
        act_as(page, base, "Ada Approver")
        page.goto(f"{base}/inbox")
        item = page.locator(f"section.inbox-item[data-run='{run_id}']")
        shown = item.locator("[data-digest]").inner_text()
        assert "send_email" in item.inner_text()
        item.locator("button[data-action=approve]").click()
        page.wait_for_url(re.compile(r"done=approve"))
        assert "Approved" in page.locator(".flash").inner_text()
    [decided] = decisions(rt, run_id)
    assert (decided.approved, decided.digest, decided.actor) == (True, shown, "Ada Approver")
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.COMPLETED


def test_run_page__deny(rt: Runtime, page: Any) -> None:
    """Denying on the run page records a denial and the run carries on to the end."""
    run_id = settle(rt, APPROVAL)
    with serving(rt) as base:
        page.goto(f"{base}/runs/{run_id}")
        page.click("#decision button[data-action=deny]")
        page.wait_for_url(re.compile(r"done=deny"))
    [decided] = decisions(rt, run_id)
    assert (decided.approved, decided.actor) == (False, "console:browser")
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.COMPLETED


def test_inbox__answer_an_input_form(rt: Runtime, page: Any) -> None:
    """The form generated from the run's JSON Schema submits typed, validated input."""
    run_id = settle(rt, INPUT)
    with serving(rt) as base:
        page.goto(f"{base}/inbox")
        item = page.locator(f"section.inbox-item[data-run='{run_id}']")
        assert "Which account, how many seats?" in item.inner_text()
        item.locator("input[name='v.account']").fill("acme")
        item.locator("input[name='v.seats']").fill("3")
        item.locator("select[name='v.plan']").select_option("pro")
        item.locator("button[data-action=input]").click()
        page.wait_for_url(re.compile(r"done=input"))
    [decided] = decisions(rt, run_id)
    assert decided.input_keys == ("account", "plan", "seats")
    rt.work(burst=True)
    assert rt.get(run_id).status is RunStatus.COMPLETED


def test_run_page__cancel(rt: Runtime, page: Any) -> None:
    """Cancel on a queued run's page records Cancelled with the operator's name."""
    run_id = rt.enqueue("scripted", {"steps": 1})
    with serving(rt) as base:
        page.goto(f"{base}/runs/{run_id}")
        page.click("button[data-action=cancel]")
        page.wait_for_url(re.compile(r"done=cancel"))
        assert page.locator("h1 .badge").inner_text() == "cancelled"
    last = rt.history(run_id)[-1].event
    assert isinstance(last, Run.Cancelled)
    assert last.actor == "console:browser"


def test_dead_letters__retry(rt: Runtime, page: Any) -> None:
    """Retry on the dead-letter page puts the run back on the queue, and off the page."""
    run_id = settle(rt, DEAD)
    with serving(rt) as base:
        page.goto(f"{base}/dead-letters")
        page.click(f"tr[data-run='{run_id}'] button[data-action=retry]")
        page.wait_for_url(re.compile(r"/dead-letters\?done=retry"))
        caught_up(rt)
        page.goto(f"{base}/dead-letters")
        assert page.locator(f"tr[data-run='{run_id}']").count() == 0
    last = rt.history(run_id)[-1].event
    assert isinstance(last, Run.Retried)
    assert last.actor == "console:browser"
    assert rt.get(run_id).status is RunStatus.QUEUED


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_escape__hostile_run_renders_as_text(rt: Runtime, page: Any) -> None:
    """`<script>` and quotes in the agent name and step payload show as text; no script runs
    (the page fixture fails the test on any dialog)."""
    run_id = settle(rt, {}, agent=HOSTILE)
    with serving(rt) as base:
        page.goto(f"{base}/runs")
        assert HOSTILE in page.locator(f"tr[data-run='{run_id}']").inner_text()
        page.goto(f"{base}/runs/{run_id}")
        page.click("ol.timeline details summary >> nth=0")
        payload = page.locator("ol.timeline pre.payload >> nth=0").inner_text()
        assert "<script>alert('x')</script>" in payload
        assert "<img src=x onerror=alert(1)>" in payload
        assert page.locator("img[src=x]").count() == 0
        assert page.evaluate("document.querySelectorAll('main script').length") == 0


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_screenshots__run_page_and_inbox(rt: Runtime, page: Any, tmp_path: Path) -> None:
    """Screenshots of a run's page and of the inbox (the console guide's; refreshed into
    $STEPTRAIL_SCREENSHOTS when set)."""
    settle(rt, {"steps": 3, "fail": {"class": "server_error", "at": 2, "times": 1}})
    rt.work(burst=True)  # the retry after the requeue delay
    shown = settle(rt, {"steps": 3, "tool": {"effect": "idempotent_write", "at": 2}})
    for _ in range(4):
        settle(rt, {"steps": 2})
    settle(rt, DEAD)
    approval = settle(rt, {"steps": 2, "approval": {"at": 2, "tools": ["send_email", "post"]}})
    settle(rt, INPUT)
    rt.approve(approval, by="ops:ada", digest=rt.pending(approval).digest)
    rt.work(burst=True)
    settle(rt, APPROVAL)
    caught_up(rt)
    shots = {"console-run.png": f"/runs/{approval}", "console-inbox.png": "/inbox"}
    with serving(rt, operator="ops:ada") as base:
        for name, path in shots.items():
            page.goto(base + path)
            page.screenshot(path=str(tmp_path / name), full_page=True)
    assert shown is not None
    target = os.environ.get("STEPTRAIL_SCREENSHOTS")
    for name in shots:
        png = tmp_path / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            shutil.copy(png, Path(target) / name)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_live__a_new_run_appears_without_a_reload(rt: Runtime, page: Any) -> None:
    """The runs page polls: a run queued after it loaded shows up in place, and the page
    was not reloaded (a marker set on the window survives)."""
    settle(rt, {"steps": 1})
    with serving(rt, poll_seconds=1.0) as base:
        page.goto(f"{base}/runs")
        page.evaluate("window.__notReloaded = true")
        newcomer = rt.enqueue("scripted", {"steps": 1})
        caught_up(rt)
        page.wait_for_selector(f"tr[data-run='{newcomer}']", timeout=20_000)
        assert page.evaluate("window.__notReloaded") is True
        assert page.locator("a.tab[data-status=queued] b").inner_text() == "1"
