"""Operators keep the guarantees (ADR 0074): the 8-digit ids tables print work in every
command; read commands never create a schema (nor a SQLite file); an auto-migration says
so in one line; the mistakes people make most get a hint."""

from __future__ import annotations

import json
import os
from pathlib import Path
from uuid import UUID

import psycopg
import pytest

from steptrail.domain.ids import short_id
from tests.acceptance.helpers import steptrail
from tests.conftest import PG_ADMIN_URL, _url_for

# Every command that only reads, with the arguments it needs (a run id where it takes one).
RUN = "0190aaaa-0000-7000-8000-00000000abcd"
READS = [
    ["runs"],
    ["show", RUN],
    ["stats"],
    ["audit", RUN, "--at", "1"],
    ["verify"],
    ["events"],
    ["metrics"],
    ["dead-letters"],
]


def test_short_ids__show_approve_retry_cancel_take_what_runs_prints(db_url: str) -> None:
    waiting = steptrail(
        "enqueue", "scripted", "-r", '{"steps": 2, "approval": {"at": 2}}', url=db_url
    ).stdout.strip()
    failing = steptrail(
        "enqueue", "scripted", "-r", '{"steps": 2, "fail": {"class": "auth", "at": 1}}', url=db_url
    ).stdout.strip()
    assert steptrail("work", "--burst", url=db_url).returncode == 0
    listed = steptrail("runs", url=db_url, COLUMNS="80").stdout
    short_waiting, short_failing = short_id(UUID(waiting)), short_id(UUID(failing))
    assert short_waiting in listed
    assert short_failing in listed

    shown = steptrail("show", short_waiting, "--json", url=db_url)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run"]["run_id"] == waiting
    approved = steptrail("approve", short_waiting, "--by", "alice", url=db_url)
    assert approved.returncode == 0, approved.stderr
    retried = steptrail("retry", short_failing, "--by", "alice", url=db_url)
    assert retried.returncode == 0, retried.stderr
    cancelled = steptrail("cancel", short_failing, "--by", "bob", url=db_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.split()[0] == failing  # the full id, resolved
    assert steptrail("work", "--burst", url=db_url).returncode == 0
    assert (
        json.loads(steptrail("show", waiting, "--json", url=db_url).stdout)["run"]["status"]
        == "completed"
    )


def test_short_ids__refusals_are_clear(db_url: str) -> None:
    steptrail("enqueue", "scripted", url=db_url)
    steptrail("enqueue", "scripted", url=db_url)
    short = steptrail("show", "abc123", url=db_url)
    assert short.returncode == 2
    assert "at least 8" in short.stderr
    unknown = steptrail("show", "deadbeef", url=db_url)
    assert unknown.returncode == 1
    assert "'deadbeef'" in unknown.stderr
    # Both runs were made within the same minute: their first 8 digits are the same
    # (version 7 ids start with the time), so that prefix is ambiguous, naming both.
    runs = json.loads(steptrail("runs", "--json", url=db_url).stdout)
    first = {r["run_id"].replace("-", "")[:8] for r in runs}
    if len(first) == 1:
        ambiguous = steptrail("show", first.pop(), url=db_url)
        assert ambiguous.returncode == 2
        assert all(r["run_id"] in ambiguous.stderr for r in runs)


@pytest.mark.parametrize("command", READS, ids=lambda c: c[0])
def test_reads__a_missing_sqlite_file_is_not_created(tmp_path: Path, command: list[str]) -> None:
    target = tmp_path / "typo.db"
    done = steptrail(*command, url=f"sqlite:///{target}")
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert f"no steptrail schema at sqlite:///{target}" in done.stderr
    assert "run `steptrail migrate`" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no file, no -wal, no lock


@pytest.fixture
def empty_pg() -> str:
    name = f"steptrail_guard_empty_{os.getpid()}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield _url_for(name)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def catalog(url: str) -> tuple[int, int]:
    """Relations and functions in the database's public schema."""
    with psycopg.connect(url) as conn:
        relations = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public'"
        ).fetchone()
        functions = conn.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public'"
        ).fetchone()
    assert relations is not None
    assert functions is not None
    return int(relations[0]), int(functions[0])


def test_reads__an_empty_postgres_database_stays_empty(empty_pg: str) -> None:
    for command in READS:
        done = steptrail(*command, url=empty_pg)
        assert done.returncode == 3, (command, done.stdout, done.stderr)
        assert "no steptrail schema at postgresql://" in done.stderr, command
        assert catalog(empty_pg) == (0, 0), command
    # A command that may create the schema does, and says so in one line naming the database.
    made = steptrail("enqueue", "scripted", url=empty_pg)
    assert made.returncode == 0, made.stderr
    lines = [json.loads(x) for x in made.stderr.splitlines() if x.startswith("{")]
    migrated = [x for x in lines if x.get("event") == "schema_migrated"]
    assert len(migrated) == 1
    assert migrated[0]["database"] == empty_pg
    assert steptrail("runs", url=empty_pg).returncode == 0


def test_reads__a_schema_behind_is_reported_not_upgraded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    from steptrail.infrastructure.sqlite import SQLiteRunStore

    store = SQLiteRunStore(url)
    store.migrate(upto=30)
    store.close()
    behind = steptrail("runs", url=url)
    assert behind.returncode == 3
    assert "migration(s) behind" in behind.stderr
    assert steptrail("migrate", url=url).returncode == 0
    assert steptrail("runs", url=url).returncode == 0


def test_hints__positional_request_and_unknown_agent(sqlite_url: str) -> None:
    positional = steptrail("enqueue", "scripted", '{"steps": 1}', url=sqlite_url)
    assert positional.returncode == 2
    assert "-r '" in positional.stderr
    unknown = steptrail("enqueue", "triage", url=sqlite_url, STEPTRAIL_APP="")
    assert unknown.returncode == 2
    assert "--app" in unknown.stderr
    assert "STEPTRAIL_APP" in unknown.stderr


def table_lines(text: str) -> list[str]:
    """The body rows of a Rich table as printed (between the header rule and the bottom)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    return lines[start + 1 : end]


@pytest.mark.parametrize("columns", [80, 120])
def test_runs__one_line_per_run_at_80_and_120_columns(db_url: str, columns: int) -> None:
    """`steptrail runs` in a terminal of 80 or 120 columns prints each run on one line no
    wider than the terminal: the id whole (8 digits under 120 columns, all of it from
    120), agent, status and reason whole, what a run waits for cut rather than folded, and
    the columns that say least (requeues, steps, since) left out when they do not fit."""

    def enqueue(request: dict[str, object]) -> str:
        return steptrail(
            "enqueue", "scripted", "-r", json.dumps(request), url=db_url
        ).stdout.strip()

    ids = [
        enqueue(request)
        for request in (
            {"steps": 2, "approval": {"at": 2}},
            {"steps": 2, "fail": {"class": "auth", "at": 1}},
            {"steps": 1},
        )
    ]
    assert steptrail("work", "--burst", url=db_url).returncode == 0
    ids.append(enqueue({"steps": 1}))
    listed = steptrail("runs", url=db_url, COLUMNS=str(columns))
    assert listed.returncode == 0, listed.stderr
    assert max(len(line) for line in listed.stdout.splitlines()) <= columns
    rows = table_lines(listed.stdout)
    shown = [str(UUID(i)) if columns >= 120 else short_id(UUID(i)) for i in ids]
    assert sorted(line.split()[1] for line in rows) == sorted(shown)  # one line each
    cells = {line.split()[1]: [c.strip() for c in line.strip("│").split("│")] for line in rows}
    waiting, failing, done, queued = (cells[s] for s in shown)
    assert waiting[1:4] == ["scripted", "waiting_for_approval", "-"]
    assert waiting[-1].startswith("approval: send")
    assert failing[1:4] == ["scripted", "failed", "not_retryable"]
    assert done[1:4] == ["scripted", "completed", "completed"]
    assert queued[1:4] == ["scripted", "queued", "-"]
    header = listed.stdout.splitlines()[2]
    assert [h.strip() for h in header.strip("┃").split("┃")] == [
        "run",
        "agent",
        "status",
        "reason",
        "waits for",
    ]
    wide = steptrail("runs", url=db_url, COLUMNS="200").stdout  # room for every column
    assert table_lines(wide)[0].count("│") == 9
