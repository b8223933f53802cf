"""The testing kit (steptrail.testing) through its own pytest fixtures, on both backends:
runs driven to their end, time skipping, fault injection, decisions, replay checks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from steptrail import App, ClassifiedError, RunContext
from steptrail.domain.enums import Effect, FailureClass, Outcome, RunStatus, TerminationReason
from steptrail.domain.run import Run
from steptrail.testing import (
    Kit,
    TimeSkippingUnsupported,
    crash_at,
    fail_at,
    lose_lease_at,
    replay_check,
    replay_fixture,
    save_fixture,
)

CALLS: Counter[str] = Counter()
ROOT = Path(__file__).resolve().parents[2]


def booking_app(*, nights_step: str = "nights", currency: str | None = None) -> App:
    """An agent that looks up a price, asks approval to book, and books (a write)."""
    app = App()
    app.tool("price", effect=Effect.READ_ONLY)
    app.tool("book", effect=Effect.NON_IDEMPOTENT_WRITE)

    @app.agent("booking")
    def booking(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        def count(name: str, value: Any) -> Any:
            CALLS[name] += 1
            return value

        nights = ctx.step("think", nights_step, lambda: count("nights", 2))
        price = ctx.tool("price", lambda: count("price", 100 * nights), arguments={"n": nights})
        arguments = {"city": request["city"], "price": price}
        if currency is not None:
            arguments["currency"] = currency
        decision = ctx.request_approval([{"name": "book", "arguments": arguments}])
        results = ctx.run_pending({"book": lambda city, **_: count("book", f"booked {city}")})
        return {"approved": decision.approved, "results": [r.value or r.error for r in results]}

    return app


def ladder_app() -> App:
    """An agent whose model call fails with a 503 three times, then answers."""
    app = App()

    @app.agent("flaky")
    def flaky(ctx: RunContext, request: dict[str, Any]) -> str:
        def call() -> str:
            CALLS["model"] += 1
            if CALLS["model"] <= 3:
                raise ClassifiedError(FailureClass.SERVER_ERROR, "503")
            return "answer"

        return ctx.llm("draft", call)

    return app


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    CALLS.clear()


@pytest.fixture
def steptrail_database_url(db_url: str) -> str:
    """The project's suite runs the kit on both backends (the session's PostgreSQL database)."""
    return db_url


@pytest.fixture
def steptrail_settings(backend: str) -> dict[str, Any]:
    # PostgreSQL cannot skip time: short leases and delays there, production ones on SQLite.
    if backend == "postgres":
        return {"lease_seconds": 1.0, "retry_base_seconds": 0.05, "poll_interval": 0.05}
    return {"poll_interval": 0.05}


@pytest.fixture
def steptrail_app() -> App:
    app = booking_app()
    app.include(ladder_app())
    return app


def test_run_to_end__approve_runs_the_write_once(steptrail_kit: Kit) -> None:
    """Approving at the suspension resumes the run, which books once and completes."""
    result = steptrail_kit.run_to_end("booking", {"city": "Oslo"}, decide="approve")
    assert result.status is RunStatus.COMPLETED
    assert result.result == {"approved": True, "results": ["booked Oslo"]}
    assert CALLS == {"nights": 1, "price": 1, "book": 1}
    assert result.step_names() == ["nights", "price", "approval", "book"]
    assert result.journal == []  # deleted on settle


def test_run_to_end__deny_books_nothing(steptrail_kit: Kit) -> None:
    """Denying gives each pending call the denial and never runs the write."""
    result = steptrail_kit.run_to_end("booking", {"city": "Oslo"}, decide="deny")
    assert result.status is RunStatus.COMPLETED
    assert result.result == {"approved": False, "results": ["denied by the operator"]}
    assert CALLS["book"] == 0


def test_run_to_end__no_decision_leaves_it_waiting_with_its_journal(steptrail_kit: Kit) -> None:
    """Without `decide` the kit stops at the suspension; the journal is there to inspect."""
    result = steptrail_kit.run_to_end("booking", {"city": "Oslo"})
    assert result.status is RunStatus.WAITING_FOR_APPROVAL
    assert result.outcome is Outcome.AWAITING_APPROVAL
    assert [e.name for e in result.journal] == ["nights", "price"]


def test_skip__refused_on_postgres(steptrail_kit: Kit, backend: str) -> None:
    """A PostgreSQL database the kit did not create reads the server's clock: skip() says so
    instead of pretending."""
    if backend == "sqlite":
        before = steptrail_kit.now()
        steptrail_kit.skip(10)
        assert (steptrail_kit.now() - before).total_seconds() >= 10
        return
    with pytest.raises(TimeSkippingUnsupported, match="server's clock"):
        steptrail_kit.skip(10)


def test_crash_at__write_recorded_before_the_crash_is_not_run_again(steptrail_kit: Kit) -> None:
    """A crash after the price step (before its record): the reaper reclaims the run, the
    price step runs again, the booking happens once."""
    result = steptrail_kit.run_to_end(
        "booking", {"city": "Oslo"}, decide="approve", faults=[crash_at(2)]
    )
    assert result.crashes == 1
    assert result.status is RunStatus.COMPLETED
    assert CALLS == {"nights": 1, "price": 2, "book": 1}
    assert any(isinstance(e, Run.Reclaimed) for e in result.events)


def test_crash_at__unrecorded_non_idempotent_write_dead_letters(steptrail_kit: Kit) -> None:
    """A crash right after the booking ran (before its result was stored): the run is
    dead-lettered rather than book twice."""
    result = steptrail_kit.run_to_end(
        "booking", {"city": "Oslo"}, decide="approve", faults=[crash_at(4)]
    )
    assert result.crashes == 1
    assert CALLS["book"] == 1
    assert result.status is RunStatus.FAILED
    reason = result.row.state.reason
    assert isinstance(reason, TerminationReason)
    assert reason.is_dead_letter


def test_lose_lease_at__zombie_stops_and_the_run_still_completes(steptrail_kit: Kit) -> None:
    """Losing the run before step 2 ends that segment `lease_lost`; the next one finishes."""
    result = steptrail_kit.run_to_end(
        "booking", {"city": "Oslo"}, decide="approve", faults=[lose_lease_at(2)]
    )
    assert Outcome.LEASE_LOST in [s.outcome for s in result.segments]
    assert result.status is RunStatus.COMPLETED
    assert CALLS["book"] == 1


def test_fail_at__not_retryable_class_dead_letters(steptrail_kit: Kit) -> None:
    """An injected `client_error` at step 1 is not retried: the run fails at once."""
    result = steptrail_kit.run_to_end(
        "booking", {"city": "Oslo"}, faults=[fail_at(1, "client_error")]
    )
    assert result.status is RunStatus.FAILED
    assert result.row.state.failure_class is FailureClass.CLIENT_ERROR
    assert CALLS["nights"] == 0
    assert result.steps[0].error_type == "InjectedFailure"


def test_fail_at__retryable_class_is_retried(steptrail_kit: Kit) -> None:
    """An injected `server_error` at step 2 goes down the retry ladder and the run completes."""
    result = steptrail_kit.run_to_end(
        "booking", {"city": "Oslo"}, decide="approve", faults=[fail_at(2, "server_error")]
    )
    assert result.status is RunStatus.COMPLETED
    assert CALLS == {"nights": 1, "price": 1, "book": 1}


def test_replay_check__flags_changed_agent_executes_nothing(steptrail_kit: Kit) -> None:
    """A waiting run replays clean against the same code and is flagged non_deterministic
    against a changed step name, with position and steps; no step function runs."""
    waiting = steptrail_kit.run_to_end("booking", {"city": "Oslo"})
    assert waiting.status is RunStatus.WAITING_FOR_APPROVAL
    CALLS.clear()
    same = replay_check(steptrail_kit.runtime, booking_app())
    assert [(v.run_id, v.verdict) for v in same] == [(str(waiting.run_id), "ok")]
    changed = replay_check(steptrail_kit.runtime, booking_app(nights_step="stay-length"))
    assert [v.verdict for v in changed] == ["non_deterministic"]
    assert changed[0].position == 1
    assert "'nights'" in (changed[0].expected or "")
    assert "'stay-length'" in (changed[0].found or "")
    assert CALLS == {}


def test_replay_check_cli__exit_1_on_a_changed_agent(
    steptrail_kit: Kit, db_url: str, tmp_path: Path
) -> None:
    """`steptrail replay-check --app` exits 0 for unchanged code and 1 for changed code."""
    steptrail_kit.run_to_end("booking", {"city": "Oslo"})
    module = tmp_path / "kit_agents.py"
    module.write_text(
        "from tests.integration.test_testing_kit import booking_app\n"
        "same = booking_app\n"
        "changed = lambda: booking_app(nights_step='stay-length')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "steptrail", "--database-url", db_url, *args]
        return subprocess.run(
            command, check=False, env=env, capture_output=True, text=True, timeout=120
        )

    ok = check("--app", "kit_agents:same", "replay-check")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "1 replay cleanly" in ok.stdout
    bad = check("--app", "kit_agents:changed", "replay-check", "--status", "waiting_for_approval")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "non_deterministic at step 1" in bad.stdout
    assert CALLS["nights"] == 1  # the one real run; the checks ran nothing


def test_fixture_file__saved_run_replays_without_a_database(
    steptrail_kit: Kit, tmp_path: Path
) -> None:
    """A waiting run saved to a file replays against the same code and flags a change."""
    waiting = steptrail_kit.run_to_end("booking", {"city": "Oslo"})
    path = save_fixture(steptrail_kit.runtime, waiting.run_id, tmp_path / "run.json")
    CALLS.clear()
    assert replay_fixture(booking_app(), path).verdict == "ok"
    assert replay_fixture(booking_app(nights_step="other"), path).verdict == "non_deterministic"
    assert CALLS == {}


def test_replay_check__flags_a_changed_approval_request(steptrail_kit: Kit) -> None:
    """Same steps but other pending calls than the waiting run's: the decision would not
    match on resume, so the run is flagged at the approval's position."""
    steptrail_kit.run_to_end("booking", {"city": "Oslo"})
    [verdict] = replay_check(steptrail_kit.runtime, booking_app(currency="NOK"))
    assert verdict.verdict == "non_deterministic"
    assert verdict.position == 3
    assert "decision 'approval'" in (verdict.expected or "")


def test_replay_check__a_run_queued_for_retry_is_checked(steptrail_kit: Kit) -> None:
    """A run requeued after a failure keeps its journal and is checked too."""
    run_id = steptrail_kit.enqueue("booking", {"city": "Oslo"})
    steptrail_kit.drive(run_id, faults=[fail_at(2, "server_error")], stop_after=1)
    assert steptrail_kit.runtime.get(run_id).status is RunStatus.QUEUED
    [verdict] = replay_check(steptrail_kit.runtime, booking_app(nights_step="x"), status="queued")
    assert (verdict.verdict, verdict.position) == ("non_deterministic", 1)
