"""`steptrail enqueue --from FILE.jsonl` (ADR 0044), as an operator runs it, on both backends:
every line checked before anything is written, errors naming the line, keys honoured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.helpers import REPO, env_for, steptrail


def _line(i: int, **extra: object) -> str:
    return json.dumps({"agent": "scripted", "request": {"steps": 1, "result": {"i": i}}, **extra})


def _runs(url: str) -> int:
    shown = steptrail("runs", "--limit", "10000", "--json", url=url)
    assert shown.returncode == 0, shown.stderr
    return len(json.loads(shown.stdout))


def test_from_file__ids_in_order_keys_honoured_views_verify(db_url: str, tmp_path: Path) -> None:
    lines = [_line(i) for i in range(2500)]
    lines[10] = _line(10, idempotency_key="k")
    lines[2000] = _line(2000, idempotency_key="k")  # a later batch: the first one's run
    lines[7] = json.dumps({"request": {"steps": 2}})  # the default agent from the argument
    lines.insert(3, "")  # blank lines are skipped (line numbers still count them)
    lines.insert(4, "   ")
    source = tmp_path / "runs.jsonl"
    source.write_text("\n".join(lines) + "\n")
    made = steptrail("enqueue", "scripted", "--from", str(source), "--batch", "700", url=db_url)
    assert made.returncode == 0, made.stderr
    ids = made.stdout.split()
    assert len(ids) == 2500
    assert ids[10] == ids[2000]
    assert len(set(ids)) == 2499
    assert _runs(db_url) == 2499
    again = steptrail("enqueue", "--from", str(source), url=db_url)  # line 8: no agent now
    assert again.returncode == 2
    assert "line 10 names no agent" in again.stderr
    checked = steptrail("verify", url=db_url)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_bad_line_5000_writes_nothing(db_url: str, tmp_path: Path) -> None:
    lines = [_line(i) for i in range(5000)]
    lines[4999] = json.dumps({"agent": "scripted", "request": {"steps": -1}})
    source = tmp_path / "runs.jsonl"
    source.write_text("\n".join(lines))
    made = steptrail("enqueue", "--from", str(source), url=db_url)
    assert made.returncode == 2
    assert "line 5000" in made.stderr
    assert "nothing was written" in made.stderr
    assert made.stdout == ""
    assert _runs(db_url) == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json}\n", "line 2 is not valid JSON"),
        (b"[1, 2]\n", "line 2 must be a JSON object"),
        (b'{"agent": "scripted", "request": {}}\xff\n', "line 2 is not UTF-8"),
        (b'{"agent": "scripted", "request": ' + b"[" * 3000 + b"]" * 3000 + b"}\n", "nests"),
        (b'{"agent": "scripted", "request": {"result": {"x": "' + b"x" * 10_000 + b'"}}}\n',
         "longer than"),
        (b'{"agent": "scripted", "request": {"result": {"x": "' + b"x" * 2500 + b'"}}}\n',
         "STEPTRAIL_MAX_REQUEST_BYTES"),
        (b'{"agent": "nope"}\n', "unknown agent"),
        (b'{"agent": "scripted", "idempotency_key": ""}\n', "blank"),
        (b'{"agent": "scripted", "when": "now"}\n', "unknown field 'when'"),
    ],
)  # fmt: skip
def test_hostile_lines_exit_2_naming_the_line(
    sqlite_url: str, tmp_path: Path, content: bytes, message: str
) -> None:
    source = tmp_path / "runs.jsonl"
    source.write_bytes(_line(0).encode() + b"\n" + content + _line(2).encode() + b"\n")
    made = steptrail(
        "enqueue", "--from", str(source), url=sqlite_url, STEPTRAIL_MAX_REQUEST_BYTES="2000"
    )
    assert made.returncode == 2, made.stderr
    assert message in made.stderr
    assert "error:" in made.stderr
    assert _runs(sqlite_url) == 0


def test_from_stdin_json_lines(db_url: str) -> None:
    text = "\n".join(_line(i, idempotency_key=f"k{i % 3}") for i in range(9)) + "\n"
    made = subprocess.run(
        [sys.executable, "-m", "steptrail", "enqueue", "--from", "-", "--json"],
        cwd=REPO,
        env=env_for(db_url),
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    rows = [json.loads(line) for line in made.stdout.splitlines()]
    assert [r["line"] for r in rows] == list(range(1, 10))
    assert len({r["run_id"] for r in rows}) == 3
    assert rows[0]["run_id"] == rows[3]["run_id"] == rows[6]["run_id"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["scripted", "--from", "x.jsonl", "--request", "{}"], "drop --request/--key"),
        (["scripted", "--from", "x.jsonl", "--key", "k"], "drop --request/--key"),
        (["--from", "/nonexistent/runs.jsonl"], "cannot read --from"),
        ([], "name the agent"),
    ],
)
def test_from_usage_errors(sqlite_url: str, args: list[str], message: str) -> None:
    made = steptrail("enqueue", *args, url=sqlite_url)
    assert made.returncode == 2
    assert message in made.stderr


def test_large_file_many_batches(sqlite_url: str, tmp_path: Path) -> None:
    """40,000 lines: 40 batches of the default size, every id printed once, in order."""
    source = tmp_path / "runs.jsonl"
    with source.open("w") as handle:
        for i in range(40_000):
            handle.write(_line(i, idempotency_key=f"k{i}") + "\n")
    made = steptrail("enqueue", "--from", str(source), url=sqlite_url, timeout=300)
    assert made.returncode == 0, made.stderr
    ids = made.stdout.split()
    assert len(ids) == len(set(ids)) == 40_000
    again = steptrail("enqueue", "--from", str(source), url=sqlite_url, timeout=300)
    assert again.stdout.split() == ids  # every key taken: the same runs, nothing new
    stats = steptrail("stats", "--json", url=sqlite_url)
    counts = {r["status"]: r["count"] for r in json.loads(stats.stdout)["by_status"]}
    assert counts == {"queued": 40_000}
