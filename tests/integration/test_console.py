"""The console over HTTP (Starlette's test client) on both backends: pages, keyset pages,
actions through the use cases, and the security rules. The browser tests drive the same
pages in Chromium."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the console extra is not installed")

from starlette.testclient import TestClient

from steptrail.console import ConsoleConfig, create_app
from steptrail.domain.enums import RunStatus
from steptrail.domain.ids import short_id
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
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

BASE = "http://127.0.0.1:8765"
TOKEN = "t0ken-for-the-console-tests"


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    runtime = make_runtime(db_url, app=hostile_app())
    yield runtime
    runtime.close()


def client(rt: Runtime, **config: Any) -> TestClient:
    app = create_app(rt, ConsoleConfig(project=False, operator="console:test", **config))
    return TestClient(app, base_url=BASE, follow_redirects=False)


def csrf(c: TestClient) -> str:
    """Visit a page so the console sets its CSRF cookie; return the value forms carry."""
    page = c.get("/runs")
    assert page.status_code == 200
    cookie = c.cookies.get("steptrail_csrf")
    assert cookie
    match = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert match is None or match.group(1) == cookie
    return str(cookie)


def event_count(rt: Runtime, run_id: uuid.UUID) -> int:
    return len(rt.history(run_id))


# -- pages ---------------------------------------------------------------------------------------


def test_pages__every_page_renders(rt: Runtime) -> None:
    """Overview, runs, a run, inbox and dead letters answer 200 with their content."""
    done = settle(rt, {"steps": 2})
    dead = settle(rt, DEAD)
    waiting = settle(rt, APPROVAL)
    c = client(rt)
    assert "stale leases" in c.get("/").text
    runs = c.get("/runs").text
    assert short_id(done) in runs
    assert short_id(dead) in runs
    page = c.get(f"/runs/{done}").text
    assert "StepRecorded" in page
    assert "Completed" in page
    assert "queue · priority" in page
    assert '<span class="mono">default</span> · 0' in page
    inbox = c.get("/inbox").text
    assert short_id(waiting) in inbox
    assert rt.pending(waiting).digest in inbox
    assert short_id(dead) in c.get("/dead-letters").text
    assert c.get(f"/runs/{uuid.uuid4()}").status_code == 404


def test_runs__filters_by_status_agent_reason_and_age(rt: Runtime) -> None:
    """Each filter narrows the list; an unknown status is a 400, not a silent empty page."""
    done = settle(rt, {"steps": 1})
    dead = settle(rt, DEAD)
    c = client(rt)
    failed = c.get("/runs", params={"status": "failed"}).text
    assert short_id(dead) in failed
    assert short_id(done) not in failed
    by_reason = c.get("/runs", params={"reason": "not_retryable"}).text
    assert short_id(dead) in by_reason
    assert short_id(done) not in by_reason
    other = c.get("/runs", params={"agent": "nobody"}).text
    assert "No runs match." in other
    recent = c.get("/runs", params={"age": "1h", "agent": "scripted"}).text
    assert short_id(done) in recent
    assert c.get("/runs", params={"status": "bogus"}).status_code == 400


def test_runs__keyset_pages_cover_every_run_once(rt: Runtime) -> None:
    """Walking `older »` links visits every run exactly once, newest first."""
    ids = [rt.enqueue("scripted", {"steps": 1}) for _ in range(7)]
    caught_up(rt)
    seen: list[str] = []
    pages = rt.views
    after = None
    while True:
        rows = pages.runs_page(limit=3, after=after)
        seen += [str(r.run_id) for r in rows]
        if len(rows) < 3:
            break
        last = rows[-1]
        assert last.created_at is not None
        from steptrail.infrastructure.reporting_store import PageKey

        after = PageKey(last.created_at, last.run_id)
    assert sorted(seen) == sorted(str(i) for i in ids)
    assert len(seen) == len(set(seen))
    c = client(rt)
    first = c.get("/runs").text
    assert 'rel="next"' not in first  # 7 runs fit on one page of 50


def test_run__state_at_a_version(rt: Runtime) -> None:
    """`?version=2` shows the state folded up to version 2 (claimed, running)."""
    run_id = settle(rt, {"steps": 1})
    page = client(rt).get(f"/runs/{run_id}", params={"version": 2}).text
    assert "State at version 2" in page
    assert "&#34;status&#34;: &#34;running&#34;" in page or '"status": "running"' in page


# -- actions -------------------------------------------------------------------------------------


def test_actions__cancel_retry_approve_deny_input_land_in_the_log(rt: Runtime) -> None:
    """Each action goes through its use case and is recorded under the operator's name."""
    c = client(rt)
    token = csrf(c)
    queued = rt.enqueue("scripted", {"steps": 1})
    r = c.post(f"/runs/{queued}/cancel", data={"csrf": token})
    assert r.status_code == 303
    last = rt.history(queued)[-1].event
    assert isinstance(last, Run.Cancelled)
    assert last.actor == "console:test"

    dead = settle(rt, DEAD)
    r = c.post(f"/runs/{dead}/retry", data={"csrf": token, "next": "/dead-letters"})
    assert (r.status_code, r.headers["location"]) == (303, "/dead-letters?done=retry")
    retried = rt.history(dead)[-1].event
    assert isinstance(retried, Run.Retried)
    assert retried.actor == "console:test"

    approve = settle(rt, APPROVAL)
    digest = rt.pending(approve).digest
    c.post(f"/runs/{approve}/approve", data={"csrf": token, "digest": digest})
    decided = [h.event for h in rt.history(approve) if isinstance(h.event, Run.Decided)]
    assert [(d.approved, d.actor, d.digest) for d in decided] == [(True, "console:test", digest)]

    deny = settle(rt, APPROVAL)
    c.post(f"/runs/{deny}/deny", data={"csrf": token, "digest": rt.pending(deny).digest})
    decided = [h.event for h in rt.history(deny) if isinstance(h.event, Run.Decided)]
    assert [d.approved for d in decided] == [False]

    asks = settle(rt, INPUT)
    bad = c.post(f"/runs/{asks}/input", data={"csrf": token, "v.account": "acme", "v.seats": "x"})
    assert bad.status_code == 422
    assert topics(rt, asks)[-1] == "Suspended"
    ok = c.post(
        f"/runs/{asks}/input",
        data={"csrf": token, "v.account": "acme", "v.seats": "3", "v.plan": "pro"},
    )
    assert ok.status_code == 303
    decided = [h.event for h in rt.history(asks) if isinstance(h.event, Run.Decided)]
    assert [d.input_keys for d in decided] == [("account", "plan", "seats")]
    rt.work(burst=True)
    assert rt.get(asks).status is RunStatus.COMPLETED


def test_approve__a_stale_digest_is_refused(rt: Runtime) -> None:
    """Approving with a digest other than the pending calls' changes nothing (422)."""
    run_id = settle(rt, APPROVAL)
    c = client(rt)
    before = event_count(rt, run_id)
    r = c.post(f"/runs/{run_id}/approve", data={"csrf": csrf(c), "digest": "sha256:old"})
    assert r.status_code == 422
    assert "does not match" in r.text
    assert event_count(rt, run_id) == before


def test_retry__refused_for_a_completed_run_with_a_clear_message(rt: Runtime) -> None:
    """The use case's refusal is shown (409) and nothing is written."""
    run_id = settle(rt, {"steps": 1})
    c = client(rt)
    before = event_count(rt, run_id)
    r = c.post(f"/runs/{run_id}/retry", data={"csrf": csrf(c)})
    assert r.status_code == 409
    assert "only a failed run" in r.text
    assert event_count(rt, run_id) == before


MAILED = {
    "steps": 3,
    "tool": {"effect": "non_idempotent_write", "at": 2},
    "fail": {"class": "auth", "at": 3},
}


def test_retry__the_form_resumes_or_reruns_from_a_step_through_the_use_case(
    rt: Runtime,
) -> None:
    """The run page says where a retry resumes and offers a step to run again from; from a
    step before the recorded e-mail it needs force (409 naming send_email, nothing
    written), a step outside the journal or not a number is refused (422), and a forced
    retry from step 2 is recorded with its mode and position (ADR 0070)."""
    run_id = settle(rt, MAILED)
    c = client(rt)
    token = csrf(c)
    page = c.get(f"/runs/{run_id}").text
    assert 'name="from"' in page
    assert "steps 1 to 2 replay from the journal" in page
    assert "send_email" in page
    before = event_count(rt, run_id)
    refused = c.post(f"/runs/{run_id}/retry", data={"csrf": token, "from": "2"})
    assert refused.status_code == 409
    assert "send_email" in refused.text
    for bad, says in (("9", "from step 1 to 3"), ("two", "whole number"), ("-1", "whole")):
        answer = c.post(f"/runs/{run_id}/retry", data={"csrf": token, "from": bad})
        assert answer.status_code == 422, bad
        assert says in answer.text
    assert event_count(rt, run_id) == before
    done = c.post(f"/runs/{run_id}/retry", data={"csrf": token, "from": "2", "force": "on"})
    assert done.status_code == 303
    retried = rt.history(run_id)[-1].event
    assert isinstance(retried, Run.Retried)
    assert (retried.actor, retried.mode.value, retried.position, retried.forced) == (
        "console:test",
        "from",
        2,
        True,
    )


def test_operator__name_set_on_the_page_is_recorded(rt: Runtime) -> None:
    """A name set in the header is the actor of the next action."""
    c = client(rt)
    token = csrf(c)
    assert c.post("/operator", data={"csrf": token, "name": "Dana Ops"}).status_code == 303
    queued = rt.enqueue("scripted", {})
    c.post(f"/runs/{queued}/cancel", data={"csrf": token})
    assert rt.history(queued)[-1].event.actor == "Dana Ops"


# -- security ------------------------------------------------------------------------------------


def test_escape__markup_in_agent_name_and_payload_renders_inert(rt: Runtime) -> None:
    """`<script>` and quotes from a run are escaped on every page that shows them."""
    run_id = settle(rt, {}, agent=HOSTILE)
    c = client(rt)
    for path in ("/runs", f"/runs/{run_id}", "/", "/dead-letters"):
        body = c.get(path).text
        assert "<script>alert" not in body
        assert "<img src=x" not in body
    page = c.get(f"/runs/{run_id}").text
    assert "&lt;script&gt;alert(" in page
    assert "onerror=alert(1)&gt;" in page


def test_csrf__post_without_or_with_a_wrong_token_is_refused(rt: Runtime) -> None:
    """No CSRF field, a wrong one, or a foreign Origin: 403 and nothing written."""
    run_id = rt.enqueue("scripted", {})
    c = client(rt)
    token = csrf(c)
    assert c.post(f"/runs/{run_id}/cancel", data={}).status_code == 403
    assert c.post(f"/runs/{run_id}/cancel", data={"csrf": "forged"}).status_code == 403
    foreign = c.post(
        f"/runs/{run_id}/cancel",
        data={"csrf": token},
        headers={"origin": "https://evil.example"},
    )
    assert foreign.status_code == 403
    assert topics(rt, run_id) == ["Queued"]


def test_token__every_request_needs_it_and_nothing_is_written_without(rt: Runtime) -> None:
    """With a token, pages, assets and POSTs without it get 401; `?token=` sets a cookie."""
    run_id = rt.enqueue("scripted", {})
    c = client(rt, token=TOKEN)
    assert c.get("/runs").status_code == 401
    assert c.get("/static/console.css").status_code == 401
    assert c.post(f"/runs/{run_id}/cancel", data={"csrf": "x"}).status_code == 401
    assert topics(rt, run_id) == ["Queued"]
    entry = c.get("/runs", params={"token": TOKEN, "status": "queued"})
    assert (entry.status_code, entry.headers["location"]) == (303, "/runs?status=queued")
    assert c.get("/runs").status_code == 200  # the cookie carries it now
    bearer = client(rt, token=TOKEN)
    assert bearer.get("/", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_host__a_foreign_host_header_is_refused_without_a_token(rt: Runtime) -> None:
    """DNS rebinding: a loopback console answers only to loopback Host names."""
    c = client(rt)
    assert c.get("/runs", headers={"host": "evil.example"}).status_code == 421
    assert c.get("/runs", headers={"host": "localhost:8765"}).status_code == 200


def test_read_only__hides_and_refuses_actions(rt: Runtime) -> None:
    """A read-only console shows no action forms and refuses POSTs with nothing written."""
    run_id = settle(rt, APPROVAL)
    c = client(rt, read_only=True)
    page = c.get(f"/runs/{run_id}").text
    assert 'data-action="' not in page
    assert "data-action" not in c.get("/inbox").text
    token = csrf(c)
    r = c.post(f"/runs/{run_id}/cancel", data={"csrf": token})
    assert r.status_code == 403
    assert topics(rt, run_id)[-1] == "Suspended"


def test_headers__strict_content_security_policy(rt: Runtime) -> None:
    """Pages forbid inline script and framing, and are not cached."""
    r = client(rt).get("/")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["cache-control"] == "no-store"


def test_csrf__another_apps_odd_cookie_does_not_hide_ours(rt: Runtime) -> None:
    """A malformed cookie of some other local app does not make our CSRF check fail."""
    run_id = rt.enqueue("scripted", {})
    c = client(rt)
    token = csrf(c)
    odd = f'other={{"json": [1, 2]}}; steptrail_csrf={token}; x=a b'
    r = c.post(f"/runs/{run_id}/cancel", data={"csrf": token}, headers={"cookie": odd})
    assert r.status_code == 303
    assert topics(rt, run_id)[-1] == "Cancelled"


def test_inbox__interactive_run_is_decided_elsewhere(rt: Runtime) -> None:
    """A run started interactively shows its calls but no buttons: the console never runs
    an agent, and such a run has no request to queue."""
    result = rt.start("scripted", APPROVAL)
    caught_up(rt)
    c = client(rt)
    inbox = c.get("/inbox").text
    assert short_id(result.run_id) in inbox
    assert "Started interactively" in inbox
    assert 'data-action="approve"' not in inbox


def test_runs__go_to_a_run_by_id(rt: Runtime) -> None:
    """The id box jumps to the run's page; something that is not an id is a 400."""
    run_id = rt.enqueue("scripted", {})
    c = client(rt)
    jump = c.get("/runs", params={"run": f" {run_id} "})
    assert (jump.status_code, jump.headers["location"]) == (303, f"/runs/{run_id}")
    assert c.get("/runs", params={"run": "<nope>"}).status_code == 400


def test_short_ids__box_routes_and_actions_take_what_the_tables_show(rt: Runtime) -> None:
    """The 8 digits the console shows find the run in the box, in `/runs/…` (redirected to
    the run's own URL, keeping the query) and in an action; a part two runs share is a 400
    naming both; a part nobody has is a 404 (ADR 0074)."""
    run_id = rt.enqueue("scripted", {"steps": 1})
    other = rt.enqueue("scripted", {"steps": 1})
    short = short_id(run_id)
    c = client(rt)
    jump = c.get("/runs", params={"run": short})
    assert (jump.status_code, jump.headers["location"]) == (303, f"/runs/{run_id}")
    page = c.get(f"/runs/{short}", params={"version": "1"})
    assert (page.status_code, page.headers["location"]) == (303, f"/runs/{run_id}?version=1")
    assert c.get(f"/runs/{run_id}").status_code == 200
    assert c.get("/runs/deadbeef").status_code == 404
    assert c.get("/runs/not-an-id").status_code == 404
    shared = run_id.hex[:8]
    if other.hex[:8] == shared:  # made in the same minute: the time prefix is shared
        both = c.get("/runs", params={"run": shared})
        assert both.status_code == 400
        assert str(run_id) in both.text
        assert str(other) in both.text
    token = csrf(c)
    r = c.post(f"/runs/{short}/cancel", data={"csrf": token})
    assert (r.status_code, r.headers["location"]) == (303, f"/runs/{run_id}?done=cancel")
    assert isinstance(rt.history(run_id)[-1].event, Run.Cancelled)


@pytest.mark.parametrize("target", ["//evil.example/", "/\\evil.example", "https://evil.example"])
def test_actions__never_redirect_off_the_console(rt: Runtime, target: str) -> None:
    """A forged `next` falls back to the run's own page."""
    run_id = rt.enqueue("scripted", {})
    c = client(rt)
    r = c.post(f"/runs/{run_id}/cancel", data={"csrf": csrf(c), "next": target})
    assert (r.status_code, r.headers["location"]) == (303, f"/runs/{run_id}?done=cancel")


def test_operator__a_name_outside_the_actor_rule_is_refused(rt: Runtime) -> None:
    """The header name follows the `--by` rule: markup brackets are refused, nothing set."""
    c = client(rt)
    token = csrf(c)
    r = c.post("/operator", data={"csrf": token, "name": "<b>boss</b>"})
    assert r.status_code == 422
    assert "steptrail_operator" not in r.headers.get("set-cookie", "")
