"""Queues and priorities from the command line (ADR 0077): `enqueue --queue/--priority`,
`work --queue`, `priority`, and the refusals, each exit 2 with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.acceptance.helpers import steptrail


def enqueue(url: str, *args: str) -> str:
    made = steptrail("enqueue", *args, "--json", url=url)
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["run_id"])


def shown(url: str, run_id: str) -> dict[str, object]:
    result = steptrail("show", run_id, "--json", url=url)
    assert result.returncode == 0, result.stderr
    data: dict[str, object] = json.loads(result.stdout)
    return data


def run_of(url: str, run_id: str) -> dict[str, object]:
    run: dict[str, object] = shown(url, run_id)["run"]  # type: ignore[assignment]
    return run


def event_total(url: str) -> int:
    result = steptrail("events", "--json", "--limit", "10000", url=url)
    assert result.returncode == 0, result.stderr
    return len(result.stdout.splitlines())


def test_work_queue__serves_only_its_queues_and_priority_changes_the_order(db_url: str) -> None:
    light = enqueue(db_url, "scripted", "--request", '{"steps": 1}')
    heavy = enqueue(db_url, "heavy_job")
    bulk = enqueue(db_url, "scripted", "--queue", "bulk", "--priority", "-3")
    assert (run_of(db_url, heavy)["queue"], run_of(db_url, heavy)["priority"]) == ("heavy", 5)
    assert (run_of(db_url, bulk)["queue"], run_of(db_url, bulk)["priority"]) == ("bulk", -3)
    # A negative priority is an argument, not an option.
    changed = steptrail("priority", bulk, "-7", "--json", "--by", "ops", url=db_url)
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout) == {
        "run_id": bulk,
        "queue": "bulk",
        "priority": -7,
        "status": "queued",
    }
    trail = shown(db_url, bulk)["events"]
    assert [e["event"] for e in trail] == ["Queued", "PriorityChanged"]  # type: ignore[attr-defined, index]
    worked = steptrail("work", "--burst", "--queue", "heavy", "--no-views", url=db_url)
    assert worked.returncode == 0, worked.stderr
    assert json.loads(worked.stdout.splitlines()[-1])["claimed"] == 1
    assert run_of(db_url, heavy)["status"] == "completed"
    assert run_of(db_url, light)["status"] == "queued"
    assert run_of(db_url, bulk)["status"] == "queued"
    worked = steptrail("work", "--burst", "-q", "default", "-q", "bulk", "--no-views", url=db_url)
    assert worked.returncode == 0, worked.stderr
    assert {run_of(db_url, r)["status"] for r in (light, bulk)} == {"completed"}
    # A settled run's priority is not changed.
    refused = steptrail("priority", heavy, "1", url=db_url)
    assert refused.returncode == 1
    assert "completed" in refused.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["work", "--burst", "--queue", "nope"],
            "unknown queue 'nope' (known: bulk, default, heavy)",
        ),
        (["work", "--burst", "--queue", "Bad Name"], "invalid queue name"),
        (["enqueue", "scripted", "--queue", "nope"], "unknown queue 'nope'"),
        (["enqueue", "scripted", "--queue", "-x"], "invalid queue name"),
        (["enqueue", "scripted", "--priority", "101"], "invalid priority 101"),
        (["enqueue", "heavy_job", "--priority", "-101"], "invalid priority -101"),
    ],
)
def test_refusals__exit_2_one_line_nothing_written(
    db_url: str, args: list[str], message: str
) -> None:
    run_id = enqueue(db_url, "scripted")
    before = event_total(db_url)
    result = steptrail(*args, url=db_url)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert event_total(db_url) == before
    assert run_of(db_url, run_id)["status"] == "queued"


def test_priority__out_of_range_refused_and_nothing_written(db_url: str) -> None:
    run_id = enqueue(db_url, "scripted")
    before = event_total(db_url)
    result = steptrail("priority", run_id, "1000", url=db_url)
    assert result.returncode == 2
    assert "invalid priority 1000" in result.stderr
    assert event_total(db_url) == before
    assert run_of(db_url, run_id)["priority"] == 0


def test_enqueue_from__lines_name_queue_and_priority_and_runs_filters(
    sqlite_url: str, tmp_path: Path
) -> None:
    lines = tmp_path / "runs.jsonl"
    lines.write_text(
        '{"agent": "scripted", "queue": "bulk", "priority": 4}\n'
        '{"agent": "heavy_job"}\n'
        '{"agent": "scripted"}\n'
    )
    made = steptrail("enqueue", "--from", str(lines), "--json", url=sqlite_url)
    assert made.returncode == 0, made.stderr
    listed = steptrail("runs", "--queue", "bulk", "--json", url=sqlite_url)
    assert listed.returncode == 0, listed.stderr
    assert [(r["queue"], r["priority"]) for r in json.loads(listed.stdout)] == [("bulk", 4)]
    ranked = steptrail("runs", "--min-priority", "4", "--json", url=sqlite_url)
    assert sorted(r["priority"] for r in json.loads(ranked.stdout)) == [4, 5]
    table = steptrail("runs", url=sqlite_url, COLUMNS="200").stdout
    assert "queue" in table
    assert "heavy (5)" in table  # the queue column, with the priority when not 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"agent": "scripted"}\n{"agent": "scripted", "queue": "nope"}\n')
    refused = steptrail("enqueue", "--from", str(bad), url=sqlite_url)
    assert refused.returncode == 2
    assert "line 2" in refused.stderr
    assert "unknown queue 'nope'" in refused.stderr
    assert len(json.loads(steptrail("runs", "--json", url=sqlite_url).stdout)) == 3
