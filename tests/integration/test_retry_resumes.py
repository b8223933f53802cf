"""`retry` resumes from the failed run's journal (ADR 0070), on both backends: recorded
steps replay (a write is not repeated, a model call not paid again), `--from N` runs steps
N on again and asks for force before a recorded write, and racing operators retry once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from examples import retry_resumes
from steptrail import App, AsyncRunContext, RunContext
from steptrail.domain.classifier import ClassifiedError
from steptrail.domain.enums import FailureClass, RetryMode, RunStatus, TerminationReason
from steptrail.domain.errors import IllegalTransition, PendingWrite
from steptrail.domain.retry_plan import InvalidRetryPosition
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
from steptrail.workers.retries import AlreadyRetried
from tests.conftest import make_runtime


def ledger_of(path: Path) -> Counter[str]:
    """What really ran (each callable notes itself in the ledger file, outside the db)."""
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def events(rt: Runtime, run_id: UUID) -> list[Any]:
    return [h.event for h in rt.history(run_id)]


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger"


def failed_mailer(db_url: str, ledger: Path) -> UUID:
    """A `mailer` run of the buggy version: draft, e-mail, then KeyError at step 3."""
    rt = make_runtime(db_url, app=retry_resumes.buggy_app)
    try:
        run_id = rt.enqueue("mailer", {"to": "ada@example.com", "ledger": str(ledger)})
        rt.work(burst=True)
        row = rt.get(run_id)
        assert (row.status, row.state.reason) == (RunStatus.FAILED, TerminationReason.NOT_RETRYABLE)
        assert (row.state.error_type, row.state.steps) == ("KeyError", 3)
        return run_id
    finally:
        rt.close()


@pytest.fixture
def fixed(db_url: str) -> Any:
    rt = make_runtime(db_url, app=retry_resumes.app)
    yield rt
    rt.close()


def test_retry__resumes_after_the_fix_with_one_email_and_one_draft(
    db_url: str, ledger: Path, fixed: Runtime
) -> None:
    """The issue's run: fixed and retried, it completes; the e-mail was sent once and the
    model call that drafted it ran once, counted outside the database."""
    run_id = failed_mailer(db_url, ledger)
    assert ledger_of(ledger) == Counter({"draft": 1, "send_email": 1})
    assert [e.position for e in fixed.store.journal(run_id)] == [1, 2, 3]  # kept on failure
    row = fixed.retry(run_id, by="ops")
    assert row.status is RunStatus.QUEUED
    assert fixed.work(burst=True).outcomes == {"completed": 1}
    assert ledger_of(ledger) == Counter({"draft": 1, "send_email": 1})
    trail = events(fixed, run_id)
    retried = next(e for e in trail if isinstance(e, Run.Retried))
    assert (retried.mode, retried.position, retried.forced) == (RetryMode.RESUME, 3, False)
    assert [(e.count, e.last_seq) for e in trail if isinstance(e, Run.Replayed)] == [(2, 2)]
    assert fixed.get(run_id).state.steps == 4  # step 3 ran again, recorded as step 4
    assert fixed.store.journal(run_id) == []  # completing drops it


def test_retry__from_a_recorded_write_needs_force_naming_it_then_sends_again(
    db_url: str, ledger: Path, fixed: Runtime
) -> None:
    """`--from 2` would send the e-mail again: refused without force, naming send_email,
    nothing written; forced, it drops the journal from step 2 and the e-mail goes twice,
    while the draft (step 1) still replays."""
    run_id = failed_mailer(db_url, ledger)
    before = len(fixed.history(run_id))
    with pytest.raises(PendingWrite, match="send_email"):
        fixed.retry(run_id, by="ops", from_position=2)
    assert len(fixed.history(run_id)) == before
    assert [e.position for e in fixed.store.journal(run_id)] == [1, 2, 3]
    fixed.retry(run_id, by="ops", from_position=2, force=True)
    assert [e.position for e in fixed.store.journal(run_id)] == [1]
    retried = events(fixed, run_id)[-1]
    assert isinstance(retried, Run.Retried)
    assert (retried.mode, retried.position) == (RetryMode.FROM, 2)
    assert (retried.forced, retried.rerun_tools) == (True, ("send_email",))
    assert fixed.work(burst=True).outcomes == {"completed": 1}
    assert ledger_of(ledger) == Counter({"draft": 1, "send_email": 2})


def test_retry__from_after_the_writes_needs_no_force(
    db_url: str, ledger: Path, fixed: Runtime
) -> None:
    """`--from 3` re-runs only the failed step: the e-mail still replays, no force."""
    run_id = failed_mailer(db_url, ledger)
    fixed.retry(run_id, by="ops", from_position=3)
    assert fixed.work(burst=True).outcomes == {"completed": 1}
    assert ledger_of(ledger) == Counter({"draft": 1, "send_email": 1})


@pytest.mark.parametrize("position", [0, -2, 4, 10])
def test_retry__from_outside_the_recorded_steps_is_refused(
    db_url: str, ledger: Path, fixed: Runtime, position: int
) -> None:
    """N must be between 1 and the recorded steps + 1: a clear error, nothing written."""
    run_id = failed_mailer(db_url, ledger)
    before = len(fixed.history(run_id))
    with pytest.raises(InvalidRetryPosition, match="from step 1 to 3"):
        fixed.retry(run_id, by="ops", from_position=position, force=True)
    assert len(fixed.history(run_id)) == before
    assert len(fixed.store.journal(run_id)) == 3


def test_retry__a_changed_agent_fails_non_deterministic(db_url: str, ledger: Path) -> None:
    """A retry replays like any segment: an agent whose recorded steps changed is stopped
    with `non_deterministic` before anything runs again."""
    run_id = failed_mailer(db_url, ledger)
    changed = App()
    changed.tool("send_email", effect="non_idempotent_write")

    @changed.agent("mailer")
    def mailer(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("draft-v2", lambda: "another draft")
        return {}

    rt = make_runtime(db_url, app=changed)
    try:
        rt.retry(run_id, by="ops")
        rt.work(burst=True)
        row = rt.get(run_id)
        assert row.status is RunStatus.FAILED
        assert row.state.failure_class is FailureClass.NON_DETERMINISTIC
        dead = events(rt, run_id)[-1]
        assert isinstance(dead, Run.DeadLettered)
        assert "step 1" in dead.cause
        assert "'draft-v2'" in dead.cause
        assert ledger_of(ledger) == Counter({"draft": 1, "send_email": 1})
    finally:
        rt.close()


def flaky_mailer(ledger: Path, broken: dict[str, bool]) -> App:
    """Draft, e-mail, then a step that fails with a transient error while `broken` is set."""
    app = App()
    app.tool("send_email", effect="non_idempotent_write")

    def note(what: str) -> None:
        with ledger.open("a") as f:
            f.write(f"{what}\n")

    @app.agent("flaky_mailer")
    def agent(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.llm("draft", lambda: note("draft") or "hi")
        ctx.tool("send_email", lambda: note("send_email") or "sent", arguments={"to": "x"})

        def confirm() -> str:
            note("confirm")
            if broken["on"]:
                raise ClassifiedError(FailureClass.SERVER_ERROR, "503")
            return "ok"

        return {"confirmed": ctx.llm("confirm", confirm)}

    return app


def test_retry__a_dead_letter_of_exhausted_retries_resumes(db_url: str, ledger: Path) -> None:
    """A run dead-lettered `retries_exhausted` (four executions of the failing step),
    retried with a fresh budget once the outage is over, resumes: one draft, one e-mail."""
    broken = {"on": True}
    rt = make_runtime(db_url, app=flaky_mailer(ledger, broken))
    try:
        run_id = rt.enqueue("flaky_mailer", {})
        deadline = time.monotonic() + 30
        while not rt.get(run_id).status.is_terminal and time.monotonic() < deadline:
            rt.work(burst=True)
            time.sleep(0.05)  # the requeue's backoff (at most 0.2 s here)
        row = rt.get(run_id)
        assert (row.status, row.state.reason) == (
            RunStatus.FAILED,
            TerminationReason.RETRIES_EXHAUSTED,
        )
        assert ledger_of(ledger) == Counter({"draft": 1, "send_email": 1, "confirm": 4})
        broken["on"] = False
        rt.retry(run_id, by="ops", reset_budget=True)
        assert rt.work(burst=True).outcomes == {"completed": 1}
        assert ledger_of(ledger) == Counter({"draft": 1, "send_email": 1, "confirm": 5})
    finally:
        rt.close()


def test_retry__two_operators_at_once_one_wins(
    db_url: str, ledger: Path, fixed: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's retry lands between Alice's reads and her append: hers conflicts and is
    refused naming Bob, nothing is doubled (one Retried, the journal not cut by her
    `--from 1`), and the run sends its e-mail once."""
    run_id = failed_mailer(db_url, ledger)
    bob = make_runtime(db_url, app=retry_resumes.app)
    try:
        append = fixed.store.append

        def bob_first(run: Run, **kwargs: Any) -> Any:
            bob.retry(run_id, by="bob")
            return append(run, **kwargs)

        monkeypatch.setattr(fixed.store, "append", bob_first)
        with pytest.raises(AlreadyRetried, match="retried by bob"):
            fixed.retry(run_id, by="alice", from_position=1, force=True)
        monkeypatch.undo()
        trail = events(fixed, run_id)
        assert [e.actor for e in trail if isinstance(e, Run.Retried)] == ["bob"]
        assert [e.position for e in fixed.store.journal(run_id)] == [1, 2, 3]
        assert fixed.work(burst=True).outcomes == {"completed": 1}
        assert ledger_of(ledger) == Counter({"draft": 1, "send_email": 1})
    finally:
        bob.close()


def test_retry__racing_threads_retry_once(db_url: str, ledger: Path, fixed: Runtime) -> None:
    """Four operators retry at the same moment: exactly one lands; each other is refused
    (lost the race, or found the run no longer failed)."""
    run_id = failed_mailer(db_url, ledger)
    runtimes = [make_runtime(db_url, app=retry_resumes.app) for _ in range(4)]
    start = threading.Barrier(len(runtimes))
    results: list[str] = []

    def operator(rt: Runtime, name: str) -> None:
        start.wait()
        try:
            rt.retry(run_id, by=name)
        except IllegalTransition as refused:
            results.append(type(refused).__name__)
        else:
            results.append("retried")

    threads = [
        threading.Thread(target=operator, args=(rt, f"op{i}")) for i, rt in enumerate(runtimes)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for rt in runtimes:
            rt.close()
    assert sorted(results).count("retried") == 1, results
    assert len(results) == 4
    assert sum(isinstance(e, Run.Retried) for e in events(fixed, run_id)) == 1
    assert fixed.work(burst=True).outcomes == {"completed": 1}
    assert ledger_of(ledger) == Counter({"draft": 1, "send_email": 1})


def async_mailers(ledger: Path) -> tuple[App, App]:
    """The mailer's two versions as `async def` agents."""
    apps = (App(), App())

    def note(what: str) -> None:
        with ledger.open("a") as f:
            f.write(f"{what}\n")

    for version, app in enumerate(apps, start=1):
        app.tool("send_email", effect="non_idempotent_write")

        async def agent(
            ctx: AsyncRunContext, request: dict[str, Any], version: int = version
        ) -> dict[str, Any]:
            async def draft() -> str:
                note("draft")
                return "hello"

            async def send() -> dict[str, str]:
                note("send_email")
                return {"message_id": "m1"}

            body = await ctx.llm("draft", draft)
            receipt = await ctx.tool("send_email", send, arguments={"body": body})
            key = "id" if version == 1 else "message_id"
            return {"logged": await ctx.step("log", "record_receipt", lambda: receipt[key])}

        app.agent("async_mailer")(agent)
    return apps


def test_retry__an_async_agent_resumes_the_same_way(db_url: str, ledger: Path) -> None:
    """An `async def` agent's failed run, fixed and retried, replays its draft and e-mail
    and completes: one of each."""
    buggy, fixed_app = async_mailers(ledger)
    rt = make_runtime(db_url, app=buggy)
    try:
        run_id = rt.enqueue("async_mailer", {})
        rt.work(burst=True)
        assert rt.get(run_id).status is RunStatus.FAILED
        assert len(rt.store.journal(run_id)) == 3
    finally:
        rt.close()
    rt = make_runtime(db_url, app=fixed_app)
    try:
        with pytest.raises(PendingWrite, match="send_email"):
            rt.retry(run_id, by="ops", from_position=1)
        rt.retry(run_id, by="ops")
        assert rt.work(burst=True).outcomes == {"completed": 1}
        assert ledger_of(ledger) == Counter({"draft": 1, "send_email": 1})
        trail = events(rt, run_id)
        assert [e.count for e in trail if isinstance(e, Run.Replayed)] == [2]
    finally:
        rt.close()


def test_example__the_guide_s_story_runs_on_this_backend(db_url: str, ledger: Path) -> None:
    """`examples/retry_resumes.py` (the guide's example) tells its story on both backends:
    the draft and the e-mail each really ran once."""
    assert retry_resumes.main(db_url, ledger) == ["draft", "send_email"]
