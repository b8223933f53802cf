"""Concurrency limits per key with real worker processes (issue 28's acceptance test,
ADR 0078), and the command line's --concurrency-key.

Two tenants, 500 and 5 runs queued (the 500 first), a limit of 2 per tenant, four worker
processes of two slots each, two of them SIGKILLed during the drain (and replaced): the
5 runs all start before the 500-run tenant's 20th start, and at no sampled moment do more
than 2 runs of a tenant hold a lease (sampled from the store, killed workers' leases
included until the reaper takes them back). Every run completes."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.acceptance.helpers import spawn_worker, steptrail
from tests.acceptance.keys_app import app
from tests.acceptance.test_faults import stop, wait_until
from tests.conftest import make_runtime

pytestmark = pytest.mark.slow
APP = {"STEPTRAIL_APP": "tests.acceptance.keys_app:app"}
BIG, SMALL = 500, 5


def first_start(rt: Any, run_id: UUID) -> tuple[Any, int]:
    """When the run was first claimed: (store time, log position) of its first Claimed."""
    for e in rt.history(run_id):
        if type(e.event).__name__ == "Claimed":
            return e.recorded_at, e.notification_id or 0
    raise AssertionError(f"run {run_id} never started")


def test_two_tenants_limit_two_four_workers_killed_during_the_drain(
    db_url: str, tmp_path: Path
) -> None:
    rt = make_runtime(db_url, app=app)
    procs: list[Any] = []
    peaks: list[Counter[str | None]] = []
    try:
        big = rt.enqueue_many(
            [{"agent": "tenant_task", "concurrency_key": "tenant:big", "request": {"n": n}}
             for n in range(BIG)]
        )  # fmt: skip
        small = rt.enqueue_many(
            [{"agent": "tenant_task", "concurrency_key": "tenant:small", "request": {"n": n}}
             for n in range(SMALL)]
        )  # fmt: skip
        ids = big + small
        procs = [
            spawn_worker(db_url, "--concurrency", "2", log=tmp_path / f"w{i}.log", **APP)
            for i in range(4)
        ]
        kills = [100, 300]  # completed runs at which one more worker is SIGKILLed
        spawned = 4
        samples = 0

        def sample() -> bool:
            nonlocal spawned, samples
            running = rt.store.list_rows(status="running", agent=None, reason=None, limit=1000)
            peaks.append(Counter(r.state.concurrency_key for r in running))
            samples += 1
            if samples % 20:
                return False
            rt.reap()  # the killed workers' runs come back once their leases expire
            rows = rt.store.list_rows(status="completed", agent=None, reason=None, limit=1000)
            completed = len(rows)
            if kills and completed >= kills[0]:
                kills.pop(0)
                victim = procs[len(procs) - 4]
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                procs.append(
                    spawn_worker(
                        db_url, "--concurrency", "2", log=tmp_path / f"w{spawned}.log", **APP
                    )
                )
                spawned += 1
            return completed == BIG + SMALL

        assert wait_until(sample, 120, step=0.01), "the drain did not finish"
        assert spawned == 6  # both kills happened during the drain
    finally:
        stop(procs)
    try:
        assert all(rt.get(i).status.value == "completed" for i in ids)
        over = [p for p in peaks if any(n > 2 for k, n in p.items() if k is not None)]
        assert over == []
        assert max(p["tenant:big"] for p in peaks) == 2  # the sampler did see the limit held
        big_starts = sorted(first_start(rt, i) for i in big)
        small_starts = sorted(first_start(rt, i) for i in small)
        assert small_starts[-1] < big_starts[19]
    finally:
        rt.close()


def test_enqueue_command__concurrency_key(db_url: str, tmp_path: Path) -> None:
    """--concurrency-key/-k places the run under its key with the App's limit; a bad key or
    one without a limit exits 2 and writes nothing; --from lines carry the key; show and
    runs print it."""
    assert steptrail("migrate", url=db_url, **APP).returncode == 0
    bad = steptrail("enqueue", "tenant_task", "-k", "tenant:*", url=db_url, **APP)
    assert bad.returncode == 2
    assert "invalid concurrency key" in bad.stderr
    unlimited = steptrail("enqueue", "tenant_task", "-k", "mailbox:x", url=db_url, **APP)
    assert unlimited.returncode == 2
    assert "no concurrency limit for key 'mailbox:x'" in unlimited.stderr
    lines = tmp_path / "runs.jsonl"
    lines.write_text(
        json.dumps({"agent": "tenant_task", "concurrency_key": "tenant:a"})
        + "\n"
        + json.dumps({"agent": "tenant_task", "concurrency_key": "bad key"})
        + "\n"
    )
    refused = steptrail("enqueue", "--from", str(lines), url=db_url, **APP)
    assert refused.returncode == 2
    assert "line 2" in refused.stderr
    rt = make_runtime(db_url, app=app)
    try:
        assert rt.events(limit=10) == []
    finally:
        rt.close()
    made = steptrail(
        "enqueue", "tenant_task", "--concurrency-key", "tenant:acme", url=db_url, **APP
    )
    assert made.returncode == 0, made.stderr
    run_id = made.stdout.strip()
    shown = steptrail("show", run_id, "--json", url=db_url, **APP)
    assert shown.returncode == 0, shown.stderr
    assert '"concurrency_key": "tenant:acme"' in shown.stdout
    assert '"concurrency_limit": 2' in shown.stdout
    table = steptrail("show", run_id, url=db_url, COLUMNS="200", **APP)
    assert "tenant:acme (limit 2)" in table.stdout
    listed = steptrail("runs", url=db_url, COLUMNS="200", **APP)
    assert "tenant:acme" in listed.stdout
    lines.write_text(json.dumps({"agent": "tenant_task", "concurrency_key": "tenant:b"}) + "\n")
    many = steptrail("enqueue", "--from", str(lines), url=db_url, **APP)
    assert many.returncode == 0, many.stderr
    shown = steptrail("show", many.stdout.strip(), "--json", url=db_url, **APP)
    assert '"concurrency_key": "tenant:b"' in shown.stdout
