"""The CLI as a newcomer and an operator use it: clear errors, nothing written on bad input."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from steptrail.infrastructure.factory import open_store
from tests.acceptance.helpers import steptrail


def rows(url: str) -> int:
    store = open_store(url)
    try:
        return len(store.all_rows())
    finally:
        store.close()


def test_help__every_command_explains_itself(sqlite_url: str) -> None:
    """`--help` works for the tool and for each command."""
    top = steptrail("--help", url=sqlite_url)
    assert top.returncode == 0
    commands = (
        "work",
        "enqueue",
        "show",
        "cancel",
        "reap",
        "demo",
        "migrate",
        "runs",
        "approve",
        "deny",
        "input",
        "stats",
        "dead-letters",
        "audit",
        "rebuild",
        "verify",
        "project",
        "purge",
        "metrics",
        "events",
        "retry",
        "console",
        "priority",
    )
    for command in commands:
        assert command in top.stdout
        sub = steptrail(command, "--help", url=sqlite_url)
        assert sub.returncode == 0, sub.stderr
        assert "Usage" in sub.stdout


def test_enqueue_work_show__round_trip(db_url: str) -> None:
    """Enqueue prints an id, a burst worker completes it, show prints state and trail."""
    made = steptrail("enqueue", "scripted", "--request", '{"steps": 2}', "--json", url=db_url)
    assert made.returncode == 0, made.stderr
    run_id = json.loads(made.stdout)["run_id"]
    worked = steptrail("work", "--burst", url=db_url)
    assert worked.returncode == 0, worked.stderr
    shown = steptrail("show", run_id, "--json", url=db_url)
    data = json.loads(shown.stdout)
    assert data["run"]["status"] == "completed"
    assert [e["event"] for e in data["events"]] == [
        "Queued",
        "Claimed",
        "StepRecorded",
        "StepRecorded",
        "Completed",
    ]
    text = steptrail("show", run_id, url=db_url).stdout
    assert "Event trail" in text
    assert "Completed" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "nope"], "unknown agent"),
        (["enqueue", "scripted", "--request", "{bad"], "not valid JSON"),
        (["enqueue", "scripted", "--request", "[1]"], "JSON object"),
        (["enqueue", "scripted", "--request", '{"steps": "many"}'], "invalid request"),
        (["--app", "no.such:app", "enqueue", "scripted"], "cannot import"),
    ],
)
def test_bad_input__one_line_error_exit_2_nothing_written(
    sqlite_url: str, args: list[str], message: str
) -> None:
    """Bad input gets a clear one-line error, exit code 2, and writes no run."""
    result = steptrail(*args, url=sqlite_url)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert rows(sqlite_url) == 0


def test_bad_database_url__exit_2(tmp_path: Path) -> None:
    """An unsupported or malformed URL is refused before anything is touched."""
    for url in ("mysql://x/y", f"sqlite:///{tmp_path}/missing/dir/x.db"):
        result = steptrail("enqueue", "scripted", url=url)
        assert result.returncode == 2, result.stderr
        assert "error:" in result.stderr


def test_unreachable_database__exit_3() -> None:
    """A database that cannot be reached is exit code 3 with the server's reason."""
    result = steptrail("migrate", url="postgresql://postgres@127.0.0.1:1/none")
    assert result.returncode == 3
    assert "not available" in result.stderr


def test_unknown_run__exit_1(db_url: str) -> None:
    """show and cancel of a run that does not exist fail with exit code 1 (on a database
    with the schema: without it they exit 3, tests/acceptance/test_operator_guards.py)."""
    assert steptrail("migrate", url=db_url).returncode == 0
    missing = str(uuid.uuid4())
    for command in ("show", "cancel"):
        result = steptrail(command, missing, url=db_url)
        assert result.returncode == 1
        assert "no run" in result.stderr
    assert steptrail("show", "not-a-uuid", url=db_url).returncode == 2


def test_cancel__queued_then_terminal_refused(db_url: str) -> None:
    """A queued run can be cancelled once; cancelling it again is an error."""
    run_id = steptrail("enqueue", "scripted", url=db_url).stdout.strip()
    first = steptrail("cancel", run_id, "--by", "alice", url=db_url)
    assert first.returncode == 0
    assert "cancelled" in first.stdout
    second = steptrail("cancel", run_id, url=db_url)
    assert second.returncode == 1
    assert "cannot cancel" in second.stderr
    assert steptrail("work", "--burst", url=db_url).returncode == 0
    shown = json.loads(steptrail("show", run_id, "--json", url=db_url).stdout)
    assert [e["event"] for e in shown["events"]] == ["Queued", "Cancelled"]


@pytest.mark.parametrize("limit", ["0", "-3", "abc"])
def test_reap__bad_limit_exit_2(sqlite_url: str, limit: str) -> None:
    """reap --limit takes a positive integer; anything else is a usage error (exit 2)."""
    result = steptrail("reap", "--limit", limit, url=sqlite_url)
    assert result.returncode == 2


def test_reap__reports_counts(db_url: str) -> None:
    """reap prints the one-line report, and --json the same counts as data."""
    text = steptrail("reap", url=db_url)
    assert text.stdout.strip() == (
        "Reaped 0 stale run(s): 0 requeued, 0 dead-lettered, 0 skipped "
        "(renewed or already moved on)."
    )
    data = json.loads(steptrail("reap", "--json", url=db_url).stdout)
    assert data["reaped"] == 0


def test_demo__finishes_on_embedded_sqlite(tmp_path: Path) -> None:
    """The demo runs end to end on a fresh SQLite file and shows every kind of ending."""
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    result = steptrail("demo", url=url, timeout=120)
    assert result.returncode == 0, result.stderr
    for word in ("completed", "not_retry", "cancelled", "Reclaimed", "Event trail"):
        assert word in result.stdout
    assert f"steptrail --database-url {url} console" in result.stdout
    assert "http://127.0.0.1:8765/" in result.stdout
    # Rich markup would eat "[console]" from the install hint.
    assert "'steptrail[console]'" in result.stdout.replace("\n", " ")


def test_approve_deny_input__from_the_command_line(db_url: str) -> None:
    """The inbox lists a waiting run with its digest; approve resumes it; bad input and a
    wrong digest are refused with nothing changed."""
    run_id = steptrail(
        "enqueue", "scripted", "-r", '{"steps": 2, "approval": {"at": 2}}', url=db_url
    ).stdout.strip()
    steptrail("work", "--burst", url=db_url)
    inbox = json.loads(
        steptrail("runs", "--status", "waiting_for_approval", "--json", url=db_url).stdout
    )
    assert [r["run_id"] for r in inbox] == [run_id]
    digest = inbox[0]["waiting"]["digest"]
    wrong = steptrail("approve", run_id, "--by", "alice", "--digest", "sha256:0", url=db_url)
    assert wrong.returncode == 1
    assert "does not match" in wrong.stderr
    missing_by = steptrail("approve", run_id, url=db_url)
    assert missing_by.returncode == 2
    ok = steptrail("approve", run_id, "--by", "alice", "--digest", digest, url=db_url)
    assert ok.returncode == 0, ok.stderr
    again = steptrail("deny", run_id, "--by", "bob", url=db_url)
    assert again.returncode == 1
    assert "already resuming" in again.stderr
    steptrail("work", "--burst", url=db_url)
    shown = json.loads(steptrail("show", run_id, "--json", url=db_url).stdout)
    assert shown["run"]["status"] == "completed"


def test_input__invalid_values_exit_2(db_url: str) -> None:
    """Input that fails the run's schema is a usage error; the run keeps waiting."""
    run_id = steptrail(
        "enqueue", "scripted", "-r", '{"steps": 1, "input": {"at": 1}}', url=db_url
    ).stdout.strip()
    steptrail("work", "--burst", url=db_url)
    bad = steptrail("input", run_id, "--by", "a", "--values", '{"account": 5}', url=db_url)
    assert bad.returncode == 2
    assert "account" in bad.stderr
    good = steptrail("input", run_id, "--by", "a", "--values", '{"account": "x"}', url=db_url)
    assert good.returncode == 0, good.stderr


def test_views__stats_dead_letters_verify_rebuild_audit(db_url: str) -> None:
    """The reporting commands answer from the views, rebuild them, and catch drift."""
    steptrail("enqueue", "scripted", "-r", '{"steps": 1}', url=db_url)
    dead = steptrail(
        "enqueue", "scripted", "-r", '{"fail": {"class": "auth", "at": 1}}', url=db_url
    ).stdout.strip()
    assert steptrail("work", "--burst", url=db_url).returncode == 0
    stats = json.loads(steptrail("stats", "--json", url=db_url).stdout)
    assert {(r["status"], r["count"]) for r in stats["by_status"]} == {
        ("completed", 1),
        ("failed", 1),
    }
    assert stats["stale_leases"] == 0
    letters = json.loads(steptrail("dead-letters", "--json", url=db_url).stdout)
    assert [(d["run_id"], d["reason"]) for d in letters] == [(dead, "not_retryable")]
    assert steptrail("verify", url=db_url).returncode == 0
    rebuilt = steptrail("rebuild", url=db_url)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "rebuilt run-index: 2 runs" in rebuilt.stdout
    assert steptrail("rebuild", "nope", url=db_url).returncode == 2
    audit = json.loads(steptrail("audit", dead, "--at", "2", "--json", url=db_url).stdout)
    assert audit["state"]["status"] == "running"
    assert [e["event"] for e in audit["events"]] == ["Queued", "Claimed"]
    assert steptrail("audit", dead, "--at", "99", url=db_url).returncode == 2
    store = open_store(db_url)
    try:
        with store.reporting_write() as tx:  # type: ignore[union-attr]
            tx.run("add_status_count", {"agent": "scripted", "status": "completed", "delta": 5})
    finally:
        store.close()
    drift = steptrail("verify", url=db_url)
    assert drift.returncode == 1
    assert "status counts" in drift.stdout


@pytest.mark.parametrize("days", ["0", "-1", "abc"])
def test_purge__bad_days_exit_2(sqlite_url: str, days: str) -> None:
    """purge --days takes a whole number of at least one day."""
    assert steptrail("purge", "--days", days, url=sqlite_url).returncode == 2


def test_purge__killed_mid_purge_then_rerun_finishes(db_url: str, tmp_path: Path) -> None:
    """A purge SIGKILLed between batches removed whole runs only; running it again removes
    the rest, and the views still equal a rebuild."""
    import signal
    import subprocess
    import sys
    import time

    from tests.acceptance.helpers import REPO, env_for
    from tests.conftest import make_runtime
    from tests.integration.test_retention import age

    rt = make_runtime(db_url)
    try:
        ids = [rt.enqueue("scripted", {}) for _ in range(400)]
        age(rt, ids, days=45)
        proc = subprocess.Popen(
            [sys.executable, "-m", "steptrail", "purge", "--batch", "2"],
            cwd=REPO,
            env=env_for(db_url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(rt.store.all_rows()) == 400:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _until_killed_backends_finish(db_url)
        left = len(rt.store.all_rows())
        assert 0 < left < 400, "the kill should land part-way through"
        assert rt.verify() == []
        again = json.loads(steptrail("purge", "--json", url=db_url).stdout)
        assert again["by_category"]["approval"] == left
        assert rt.store.all_rows() == []
        shown = steptrail("show", str(ids[0]), url=db_url)
        assert shown.returncode == 1
        assert "purged" in shown.stderr
    finally:
        rt.close()


def _until_killed_backends_finish(db_url: str) -> None:
    """On PostgreSQL a client killed mid-statement leaves its server backend to finish that
    statement, and an autocommit batch then commits after the kill: wait until no other
    session of the database is active, so that what the test counts is what stays."""
    if not db_url.startswith("postgresql"):
        return
    import time

    import psycopg

    deadline = time.monotonic() + 15
    with psycopg.connect(db_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND state <> 'idle'"
            ).fetchone()
            if row == (0,):
                return
            time.sleep(0.05)
    raise AssertionError("a killed client's statement still runs after 15 s")


def test_metrics__prometheus_text_from_the_views(db_url: str) -> None:
    """`steptrail metrics` prints the run counts the views hold, in Prometheus format."""
    steptrail("enqueue", "scripted", url=db_url)
    steptrail("enqueue", "scripted", "-r", '{"fail": {"class": "auth"}}', url=db_url)
    steptrail("work", "--burst", url=db_url)
    steptrail("enqueue", "scripted", url=db_url)
    text = steptrail("metrics", url=db_url).stdout
    assert 'steptrail_runs{agent="scripted",status="completed"} 1.0' in text
    assert 'steptrail_runs{agent="scripted",status="queued"} 1.0' in text
    assert 'steptrail_runs_ended{reason="not_retryable",status="failed"} 1.0' in text
    assert "steptrail_stale_leases 0.0" in text
    age = next(line for line in text.splitlines() if line.startswith("steptrail_oldest_queued"))
    assert float(age.split()[1]) >= 0.0


def test_demo__async_and_pydantic_ai_agents_and_runs_without_the_extra(tmp_path: Path) -> None:
    """The demo runs its async agent and (with the extra) the pydantic-ai agent, whose report
    call it approves; with pydantic-ai unimportable it still finishes and says how to add it."""
    import subprocess
    import sys

    from tests.acceptance.helpers import REPO, env_for

    with_extra = steptrail("demo", url=f"sqlite:///{tmp_path / 'a.db'}", timeout=120)
    assert with_extra.returncode == 0, with_extra.stderr
    assert "approved the pending send_report call" in with_extra.stdout
    blocked = (
        "import sys; sys.modules['pydantic_ai'] = None; "
        "from steptrail.cli import main; sys.argv = ['steptrail', 'demo']; main()"
    )
    without = subprocess.run(
        [sys.executable, "-c", blocked],
        cwd=REPO,
        env=env_for(f"sqlite:///{tmp_path / 'b.db'}"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert without.returncode == 0, without.stderr
    assert "pip install 'steptrail[pydantic-ai]'" in without.stdout
    assert "completed" in without.stdout


def test_retry__dead_letter_back_on_the_queue_and_refusals(db_url: str) -> None:
    """`retry` requeues a dead letter (recorded with --by); a second retry and a bare call
    are refused with clear errors; bulk retry by agent reports what it did."""
    made = steptrail(
        "enqueue",
        "scripted",
        "-r",
        '{"steps": 2, "fail": {"class": "auth", "at": 1}}',
        url=db_url,
    )
    run_id = made.stdout.strip()
    assert steptrail("work", "--burst", url=db_url).returncode == 0
    done = steptrail("retry", run_id, "--by", "alice", "--reset-budget", url=db_url)
    assert done.returncode == 0, done.stderr
    assert "queued" in done.stdout
    shown = json.loads(steptrail("show", run_id, "--json", url=db_url).stdout)
    last = shown["events"][-1]
    assert (last["event"], last["actor"], last["reset_budget"]) == ("Retried", "alice", True)
    again = steptrail("retry", run_id, "--by", "alice", url=db_url)
    assert again.returncode == 1
    assert "only a failed run" in again.stderr
    bare = steptrail("retry", url=db_url)
    assert bare.returncode == 2
    assert steptrail("work", "--burst", url=db_url).returncode == 0
    bulk = steptrail("retry", "--agent", "scripted", "--since", "1h", "--by", "bob", url=db_url)
    assert bulk.returncode == 0, bulk.stderr
    assert "retried 1 run(s), refused 0" in bulk.stdout
