"""Hostile and careless input (issue 11): nothing a request, an operator or a setting says can
break the log or reach outside it. Every case ends with `show`, `stats` and `verify` still
working; the cases the outside review found passing are kept here so they stay passing."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from steptrail.infrastructure.factory import open_store
from tests.acceptance.helpers import REPO, env_for, steptrail


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """Assert `result` failed with `code` and one `error: …` line (no traceback, no box)."""
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def healthy(url: str, run_id: str | None = None) -> None:
    """`stats`, `verify` (and `show RUN`) keep working (on a database with the schema: a
    read command never creates one, ADR 0074)."""
    assert steptrail("migrate", url=url).returncode == 0
    for args in (["stats", "--json"], ["verify"], *([["show", run_id]] if run_id else [])):
        result = steptrail(*args, url=url)
        assert result.returncode == 0, (args, result.stderr)


def runs(url: str) -> int:
    store = open_store(url)
    try:
        return len(store.all_rows())
    finally:
        store.close()


def enqueue(url: str, agent: str, request: dict[str, Any], **env: str) -> str:
    made = steptrail("enqueue", agent, "-r", json.dumps(request), url=url, **env)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def show(url: str, run_id: str) -> dict[str, Any]:
    shown = steptrail("show", run_id, "--json", url=url)
    assert shown.returncode == 0, shown.stderr
    data: dict[str, Any] = json.loads(shown.stdout)
    return data


def deep_json(levels: int) -> str:
    return '{"steps": 1, "result": {"a": ' + "[" * levels + "]" * levels + "}}"


# -- High 1: depth and size bounded at the door; whatever is accepted reads back ----------------


@pytest.mark.parametrize("levels", [70, 210, 300, 5000])
def test_enqueue__too_deep_request_refused(db_url: str, levels: int) -> None:
    """The review's repro (a result 210 levels deep at `full`) and deeper ones are refused
    with one line, exit 2, nothing written; the log stays readable."""
    result = steptrail(
        "enqueue", "scripted", "-r", deep_json(levels), url=db_url, STEPTRAIL_PRIVACY_LEVEL="full"
    )
    assert "nests more than 64 levels" in one_line_error(result, 2)
    assert runs(db_url) == 0
    healthy(db_url)


@pytest.mark.parametrize("where", ["result", "step", "conversation"])
def test_agent__too_deep_value_fails_the_run_not_the_log(db_url: str, where: str) -> None:
    """An agent producing a value deeper than the bound (result, step, saved conversation)
    fails its run, not retried; `work`, `show`, `stats` and `verify` all keep working."""
    run_id = enqueue(db_url, "deep", {"levels": 210, "where": where})
    worked = steptrail("work", "--burst", url=db_url, STEPTRAIL_PRIVACY_LEVEL="full")
    assert worked.returncode == 0, worked.stderr
    data = show(db_url, run_id)
    assert data["run"]["status"] == "failed"
    assert data["run"]["reason"] == "not_retryable"
    assert data["run"]["error_type"] == "PayloadTooDeep"
    healthy(db_url, run_id)
    assert steptrail("dead-letters", url=db_url).returncode == 0
    assert steptrail("rebuild", url=db_url).returncode == 0


def test_agent__value_just_inside_the_bound_reads_back(db_url: str) -> None:
    """A result 60 levels deep is stored and read back whole at `full`."""
    run_id = enqueue(db_url, "deep", {"levels": 60, "where": "result"})
    steptrail("work", "--burst", url=db_url, STEPTRAIL_PRIVACY_LEVEL="full")
    data = show(db_url, run_id)
    assert data["run"]["status"] == "completed"
    completed = data["events"][-1]
    value = completed["result"]["result"]["value"]
    levels = 0
    while isinstance(value, list):
        levels += 1
        value = value[0] if value else None
    assert levels == 60
    healthy(db_url, run_id)


def test_enqueue__request_size_cap(db_url: str, tmp_path: Path) -> None:
    """A request over STEPTRAIL_MAX_REQUEST_BYTES is refused (exit 2, nothing written);
    `--request @file` and `--request -` read larger requests that fit."""
    cap = {"STEPTRAIL_MAX_REQUEST_BYTES": "4096"}
    big = {"steps": 1, "result": {"text": "x" * 5000}}
    result = steptrail("enqueue", "scripted", "-r", json.dumps(big), url=db_url, **cap)
    assert "STEPTRAIL_MAX_REQUEST_BYTES" in one_line_error(result, 2)
    assert runs(db_url) == 0
    fits = {"steps": 1, "result": {"text": "y" * 3000}}
    path = tmp_path / "request.json"
    path.write_text(json.dumps(fits))
    from_file = steptrail("enqueue", "scripted", "-r", f"@{path}", url=db_url, **cap)
    assert from_file.returncode == 0, from_file.stderr
    piped = subprocess.run(
        [sys.executable, "-m", "steptrail", "enqueue", "scripted", "-r", "-"],
        cwd=REPO,
        env=env_for(db_url, **cap),
        input=json.dumps(fits),
        capture_output=True,
        text=True,
        check=False,
    )
    assert piped.returncode == 0, piped.stderr
    missing = steptrail("enqueue", "scripted", "-r", f"@{tmp_path / 'nope.json'}", url=db_url)
    assert "cannot read --request" in one_line_error(missing, 2)
    assert runs(db_url) == 2
    healthy(db_url, piped.stdout.strip())


# -- High 2: input schemas cannot reach outside, and validation is bounded ---------------------


class _Counting(BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        body = b'{"type": "string"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_input_schema__file_and_remote_refs_refused(db_url: str, tmp_path: Path) -> None:
    """A schema referring to a local file or a URL is refused when declared: the file is never
    echoed, the URL never fetched; at enqueue (scripted) or by failing the run (any agent)."""
    secret = tmp_path / "secret.json"
    secret.write_text('{"const": "TOP-SECRET-CANARY"}')
    server = HTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        remote = f"http://127.0.0.1:{server.server_address[1]}/schema.json"
        for ref in (f"file://{secret}", remote, "other.json#/x"):
            schema = {"type": "object", "properties": {"a": {"$ref": ref}}}
            refused = steptrail(
                "enqueue", "scripted", "-r", json.dumps({"input": {"schema": schema}}), url=db_url
            )
            line = one_line_error(refused, 2)
            assert "only local references" in line
            assert "TOP-SECRET-CANARY" not in refused.stderr
            run_id = enqueue(db_url, "asks", {"schema": schema})
            assert steptrail("work", "--burst", url=db_url).returncode == 0
            data = show(db_url, run_id)
            assert (data["run"]["status"], data["run"]["error_type"]) == ("failed", "InvalidSchema")
        assert _Counting.hits == 0
    finally:
        server.shutdown()
    healthy(db_url)


def test_input_schema__invalid_schema_refused_not_waiting_forever(db_url: str) -> None:
    """An invalid schema is refused at enqueue (scripted) and fails the run when another
    agent declares it, instead of leaving it waiting for input nobody can give."""
    schema = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}
    refused = steptrail(
        "enqueue", "scripted", "-r", json.dumps({"input": {"schema": schema}}), url=db_url
    )
    assert "invalid" in one_line_error(refused, 2)
    run_id = enqueue(db_url, "asks", {"schema": schema})
    steptrail("work", "--burst", url=db_url)
    assert show(db_url, run_id)["run"]["status"] == "failed"
    healthy(db_url, run_id)


def test_input__catastrophic_pattern_bounded(db_url: str) -> None:
    """A pattern with catastrophic backtracking against a hostile value is cut off within
    the validation budget (exit 2, run still waiting); good input then resumes the run."""
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^(a|a)*$"},
            "b": {"type": "string", "pattern": "^(a+)+$"},
        },
    }
    run_id = enqueue(db_url, "scripted", {"input": {"at": 1, "schema": schema}})
    steptrail("work", "--burst", url=db_url)
    for key in ("a", "b"):
        values = json.dumps({key: "a" * 40 + "!"})
        bad = steptrail(
            "input", run_id, "--by", "alice", "--values", values, url=db_url, timeout=30
        )
        one_line_error(bad, 2)
        assert show(db_url, run_id)["run"]["status"] == "waiting_for_input"
    good = steptrail("input", run_id, "--by", "alice", "--values", '{"a": "aaa"}', url=db_url)
    assert good.returncode == 0, good.stderr
    steptrail("work", "--burst", url=db_url)
    assert show(db_url, run_id)["run"]["status"] == "completed"
    healthy(db_url, run_id)


# -- Medium 3: migrate creates and upgrades with auto-migrate off --------------------------------


def test_migrate__creates_schema_with_auto_migrate_off(db_url: str, backend: str) -> None:
    """`steptrail migrate` works with STEPTRAIL_AUTO_MIGRATE=false, from an empty database."""
    off = {"STEPTRAIL_AUTO_MIGRATE": "false"}
    if backend == "postgres":
        from tests.integration.test_hostile_store import fresh_pg_database

        with fresh_pg_database() as url:
            _migrate_from_empty(url, off)
    else:
        _migrate_from_empty(db_url, off)


def _migrate_from_empty(url: str, off: dict[str, str]) -> None:
    before = steptrail("runs", url=url, **off)
    assert before.returncode == 3
    assert "run `steptrail migrate`" in before.stderr
    migrated = steptrail("migrate", url=url, **off)
    assert migrated.returncode == 0, migrated.stderr
    assert "applied: 0001_" in migrated.stdout
    again = steptrail("migrate", url=url, **off)
    assert "up to date" in again.stdout
    run_id = enqueue(url, "scripted", {}, **off)
    healthy(url, run_id)


def test_migrate__failed_open_leaves_no_sqlite_file(tmp_path: Path) -> None:
    """A command refused for a missing schema leaves no empty database file behind."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    refused = steptrail("show", str(uuid.uuid4()), url=url, STEPTRAIL_AUTO_MIGRATE="false")
    assert refused.returncode == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- Medium 4: tracebacks where 2 or 3 is promised ----------------------------------------------

HUGE = "9223372036854775808"


BAD_OPTIONS = [
    ["runs", "--limit", HUGE],
    ["dead-letters", "--limit", HUGE],
    ["reap", "--limit", HUGE],
    ["purge", "--batch", HUGE],
    ["purge", "--days", "99999999999"],
    ["reap", "--every", "inf"],
    ["reap", "--every", "nan"],
    ["project", "--every", "inf"],
    ["audit", str(uuid.UUID(int=1)), "--at", HUGE],
    ["reap", "--limit", "0"],
    ["show", "not-a-uuid"],
    ["work", "--concurrency", "0"],
    ["enqueue"],
    ["runs", "--no-such-option"],
]


def test_bad_option__one_line_exit_2(sqlite_url: str) -> None:
    """Out-of-range or malformed options get one `error:` line and exit 2, no usage box."""
    for args in BAD_OPTIONS:
        one_line_error(steptrail(*args, url=sqlite_url), 2)
    healthy(sqlite_url)


BAD_SETTINGS = [
    ("STEPTRAIL_LEASE_SECONDS", "inf"),
    ("STEPTRAIL_LEASE_SECONDS", "1e300"),
    ("STEPTRAIL_LEASE_SECONDS", "nan"),
    ("STEPTRAIL_RETRY_BASE_SECONDS", "inf"),
    ("STEPTRAIL_RETRY_CAP_SECONDS", "-1"),
    ("STEPTRAIL_POLL_INTERVAL", "0"),
    ("STEPTRAIL_MAX_REQUEUES", "1e9"),
    ("STEPTRAIL_RETENTION_DAYS", "99999999999"),
    ("STEPTRAIL_RETENTION_AGENT_RUN_DAYS", "99999999999"),
    ("STEPTRAIL_MAX_REQUEST_BYTES", "12"),
    ("STEPTRAIL_LOG_LEVEL", "loud"),
]


def test_bad_setting__names_variable_and_range(sqlite_url: str) -> None:
    """A setting out of range stops `work` (and every command) at once with one line naming
    the variable and what it may be, instead of crashing a worker later."""
    for variable, value in BAD_SETTINGS:
        line = one_line_error(steptrail("work", "--burst", url=sqlite_url, **{variable: value}), 2)
        assert variable in line
        assert any(w in line for w in ("at most", "at least", "above", "one of", "from 1")), line
    healthy(sqlite_url)


def test_metrics_serve__port_in_use_or_bad_host_exit_2(sqlite_url: str) -> None:
    """`metrics --serve` on a port in use, or on a host that does not resolve, is one line
    and exit 2."""
    assert steptrail("migrate", url=sqlite_url).returncode == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        line = one_line_error(steptrail("metrics", "--serve", port, url=sqlite_url), 2)
        assert "cannot serve metrics" in line
    bad_host = steptrail("metrics", "--serve", "9", "--host", "no such host!", url=sqlite_url)
    one_line_error(bad_host, 2)


def test_system_path__refused_and_nothing_created(tmp_path: Path) -> None:
    """A database URL into a system folder, or naming a file that is not SQLite, is refused
    and no writer-lock file appears beside it."""
    line = one_line_error(steptrail("runs", url="sqlite:////etc/passwd"), 2)
    assert "system folder /etc" in line
    assert not Path("/etc/passwd.writer-lock").exists()
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    assert "not a SQLite database" in one_line_error(steptrail("runs", url=f"sqlite:///{text}"), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def _read_only_checks(url: str, run_id: str) -> None:
    for args in (
        ["show", run_id],
        ["runs"],
        ["stats"],
        ["dead-letters"],
        ["verify"],
        ["metrics"],
        ["audit", run_id, "--at", "1"],
    ):
        result = steptrail(*args, url=url)
        assert result.returncode == 0, (args, result.stderr)
    refused = steptrail("enqueue", "scripted", url=url)
    assert "read-only" in one_line_error(refused, 1)


def test_read_only_database__readers_work(tmp_path: Path) -> None:
    """`?mode=ro` opens a SQLite database read-only: every reader works, writes are refused
    with one line, and no writer-lock file is created."""
    path = tmp_path / "ro.db"
    url = f"sqlite:///{path}"
    run_id = enqueue(url, "scripted", {})
    steptrail("work", "--burst", url=url)
    Path(f"{path}.writer-lock").unlink()
    _read_only_checks(f"{url}?mode=ro", run_id)
    assert not Path(f"{path}.writer-lock").exists()


def test_read_only_mount__readers_work(tmp_path: Path) -> None:
    """On a read-only mount (a bind mount remounted ro), readers work without any flag."""
    source, mounted = tmp_path / "src", tmp_path / "ro"
    source.mkdir()
    mounted.mkdir()
    url = f"sqlite:///{source / 'steptrail.db'}"
    run_id = enqueue(url, "scripted", {})
    steptrail("work", "--burst", url=url)
    checkpoint = open_store(url)
    checkpoint.after_purge()  # fold the WAL into the file, as a clean shutdown leaves it
    checkpoint.close()
    for name in ("steptrail.db-wal", "steptrail.db-shm", "steptrail.db.writer-lock"):
        (source / name).unlink(missing_ok=True)
    bind = subprocess.run(["mount", "--bind", str(source), str(mounted)], check=False)
    if bind.returncode != 0:
        pytest.skip("cannot bind-mount here (needs root); ?mode=ro is covered above")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mounted)], check=True)
        _read_only_checks(f"sqlite:///{mounted / 'steptrail.db'}", run_id)
    finally:
        subprocess.run(["umount", str(mounted)], check=False)


# -- Medium 5: actor names ------------------------------------------------------------------------


BAD_NAMES = [
    "",
    " ",
    "[bold red]admin[/]",
    "alice\x1b[2J",
    "bob\u202eevil",
    "x" * 100_000,
    " alice",
]


def test_by__refused_exit_2(db_url: str) -> None:
    """`--by` names that are empty, blank, markup, escapes, invisible controls, too long or
    padded are refused with exit 2 for every command that records one; nothing changes."""
    run_id = enqueue(db_url, "scripted", {"approval": {"at": 1}})
    steptrail("work", "--burst", url=db_url)
    values = ["--values", '{"account": "x"}']
    for name in BAD_NAMES:
        for command in ("approve", "deny", "cancel"):
            one_line_error(steptrail(command, run_id, "--by", name, url=db_url), 2)
        one_line_error(steptrail("input", run_id, "--by", name, *values, url=db_url), 2)
    assert show(db_url, run_id)["run"]["status"] == "waiting_for_approval"
    healthy(db_url, run_id)


def test_show__stored_strings_rendered_inert(db_url: str) -> None:
    """Strings a request chose (here tool names with markup and terminal escapes) are shown
    escaped: no escape byte reaches the terminal and markup is printed literally."""
    tools = ["[bold red]APPROVED[/]", "evil\x1b[2Jname"]
    run_id = enqueue(
        db_url, "scripted", {"approval": {"at": 1, "tools": tools}}, STEPTRAIL_PRIVACY_LEVEL="full"
    )
    steptrail("work", "--burst", url=db_url, STEPTRAIL_PRIVACY_LEVEL="full")
    shown = steptrail("show", run_id, url=db_url).stdout
    assert "[bold red]APPROVED[/]" in shown
    assert "\\x1b" in shown
    for args in (["show", run_id], ["runs"]):
        text = steptrail(*args, url=db_url).stdout
        assert "\x1b" not in text
        assert "[bold" in text
    ok = steptrail("approve", run_id, "--by", "Zoë O'Neil (ops)", url=db_url)
    assert ok.returncode == 0, ok.stderr
    trail = show(db_url, run_id)["events"]
    assert [e["actor"] for e in trail if e["event"] == "Decided"] == ["Zoë O'Neil (ops)"]
    healthy(db_url, run_id)


# -- Medium 6: database URLs ------------------------------------------------------------------


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://", "sqlite:///x.db?mode=rw"])
def test_database_url__in_memory_by_accident_refused(sqlite_url: str, url: str) -> None:
    """`sqlite:///` and `sqlite://` name no file: refused instead of a vanishing in-memory
    database."""
    refused = steptrail("--database-url", url, "enqueue", "scripted", url=sqlite_url)
    assert "sqlite" in one_line_error(refused, 2).lower()


def test_database_url__empty_refused(sqlite_url: str, tmp_path: Path) -> None:
    """An empty --database-url or STEPTRAIL_DATABASE_URL is refused, not `./steptrail.db`."""
    line = one_line_error(steptrail("--database-url", "", "runs", url=sqlite_url), 2)
    assert "--database-url" in line
    line = one_line_error(steptrail("runs", url=""), 2)
    assert "STEPTRAIL_DATABASE_URL" in line
    assert not (REPO / "steptrail.db").exists() or (REPO / "steptrail.db").stat().st_size > 0


# -- Medium 8: embedded use does not write to stdout --------------------------------------------

EMBEDDED = """
import logging, sys, steptrail
if sys.argv[2] == "host":
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(message)s")
with steptrail.open(url=sys.argv[1]) as rt:
    for _ in range(5):
        rt.enqueue("scripted", {})
    rt.work(burst=True)
"""


@pytest.mark.parametrize("host", ["none", "host"])
def test_embedded__no_stdout_host_logging_decides(db_url: str, host: str, tmp_path: Path) -> None:
    """`steptrail.open()` prints nothing to stdout; with the host's logging configured the
    records go where it says, filtered by STEPTRAIL_LOG_LEVEL."""
    script = tmp_path / "embed.py"
    script.write_text(EMBEDDED)

    def run(**env: str) -> subprocess.CompletedProcess[str]:
        full = env_for(db_url, **env)
        full.pop("STEPTRAIL_LOG_LEVEL", None) if "STEPTRAIL_LOG_LEVEL" not in env else None
        return subprocess.run(
            [sys.executable, str(script), db_url, host],
            cwd=REPO,
            env=full,
            capture_output=True,
            text=True,
            check=False,
        )

    plain = run()
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == ""
    if host == "host":
        assert plain.stderr.count("run_enqueued") == 5
        assert "steptrail " in plain.stderr
        quiet = run(STEPTRAIL_LOG_LEVEL="warning")
        assert quiet.stdout == ""
        assert "run_enqueued" not in quiet.stderr
    else:
        assert "run_enqueued" not in plain.stderr


def test_cli__json_logs_still_on_stderr(db_url: str) -> None:
    """The CLI keeps its JSON log lines on stderr."""
    steptrail("enqueue", "scripted", url=db_url)
    worked = steptrail("work", "--burst", url=db_url)
    events = [json.loads(line) for line in worked.stderr.splitlines() if line.startswith("{")]
    assert "run_completed" in {e["event"] for e in events}
    assert all("timestamp" in e and "level" in e for e in events)


# -- Low 9: privacy of declared schemas ------------------------------------------------------


@pytest.mark.parametrize(("level", "kept"), [("metadata", False), ("none", False), ("full", True)])
def test_privacy__schema_free_text_not_in_the_log(db_url: str, level: str, kept: bool) -> None:
    """At metadata (and none) the Suspended event keeps the schema's digest and property
    names, not its free text; at full it keeps the schema."""
    schema = {
        "type": "object",
        "description": "CANARY-7f3a",
        "properties": {"account": {"type": "string", "title": "CANARY-7f3a"}},
    }
    env = {"STEPTRAIL_PRIVACY_LEVEL": level}
    run_id = enqueue(db_url, "scripted", {"input": {"at": 1, "schema": schema}}, **env)
    steptrail("work", "--burst", url=db_url, **env)
    data = show(db_url, run_id)
    suspended = next(e for e in data["events"] if e["event"] == "Suspended")
    assert ("CANARY-7f3a" in json.dumps(suspended)) is kept
    assert ("CANARY-7f3a" in json.dumps(data["run"])) is kept
    if not kept:
        assert suspended["input_schema"]["properties"] == ["account"]
    ok = steptrail("input", run_id, "--by", "a", "--values", '{"account": "x"}', url=db_url)
    assert ok.returncode == 0, ok.stderr
    healthy(db_url, run_id)


@pytest.mark.parametrize(("level", "kept"), [("metadata", False), ("full", True)])
def test_privacy__request_chosen_tool_names_not_in_the_log(
    db_url: str, level: str, kept: bool
) -> None:
    """A tool name a request chose is not stored (step, marker, waiting calls) below
    `redacted`; declared tool names are."""
    env = {"STEPTRAIL_PRIVACY_LEVEL": level}
    request = {
        "steps": 2,
        "tool": {"name": "CANARY-tool", "at": 1},
        "approval": {"at": 2, "tools": ["CANARY-call", "send_email"]},
    }
    run_id = enqueue(db_url, "scripted", request, **env)
    worked = steptrail("work", "--burst", url=db_url, **env)
    data = show(db_url, run_id)
    text = json.dumps(data)
    assert ("CANARY" in text) is kept
    assert ("CANARY" in worked.stderr) is kept
    assert "send_email" in data["run"]["waiting"]["pending_tools"]
    healthy(db_url, run_id)


# -- what the review found passing, kept passing ---------------------------------------------


def test_review_passing_cases__stay_passing(db_url: str) -> None:
    """Malformed JSON, unknown agents, injection-looking names, wrong digests and double
    approvals: one line, the right exit code, nothing lost."""
    assert steptrail("migrate", url=db_url).returncode == 0
    for args, code in (
        (["enqueue", "scripted", "-r", "{bad"], 2),
        (["enqueue", "scripted", "-r", "[1]"], 2),
        (["enqueue", "'; DROP TABLE steptrail_events; --"], 2),
        (["enqueue", "scripted", "--key", "   "], 2),
        (["show", str(uuid.uuid4())], 1),
    ):
        one_line_error(steptrail(*args, url=db_url), code)
    sneaky = steptrail("runs", "--agent", "x' OR '1'='1", "--json", url=db_url)
    assert json.loads(sneaky.stdout) == []
    run_id = enqueue(db_url, "scripted", {"approval": {"at": 1}})
    steptrail("work", "--burst", url=db_url)
    wrong = steptrail("approve", run_id, "--by", "alice", "--digest", "sha256:00", url=db_url)
    assert "does not match" in one_line_error(wrong, 1)
    assert steptrail("approve", run_id, "--by", "alice", url=db_url).returncode == 0
    again = steptrail("approve", run_id, "--by", "bob", url=db_url)
    assert "already resuming" in one_line_error(again, 1)
    steptrail("work", "--burst", url=db_url)
    assert show(db_url, run_id)["run"]["status"] == "completed"
    healthy(db_url, run_id)
