"""`steptrail demo`: a tour of the runtime on whatever database is configured (SQLite by
default), finished in a few seconds.

It queues scripted runs that complete, retry after a transient failure, dead-letter on an
auth error, run a write tool, wait for (and get) an approval, get cancelled, and one that a
"ghost" worker claims and then abandons (as if its machine died); an async agent; and, with
the `pydantic-ai` extra installed, a pydantic-ai agent whose report tool waits for approval.
Two workers and a reaper then drive everything to an end.
"""

from __future__ import annotations

import re
import threading
import time
from uuid import UUID

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from steptrail.demo_agents import demo_agents
from steptrail.domain.enums import RunStatus
from steptrail.render import compact_runs_table, print_run
from steptrail.runtime import Runtime

DEADLINE_S = 60.0


def run_demo(rt: Runtime, console: Console, *, plain_runs: int = 6) -> list[UUID]:
    """Run the tour; returns the ids of the demo's runs."""
    ids: list[UUID] = []
    # The ghost: claimed by a worker that never heartbeats, so its lease (1 s here) expires
    # and the reaper puts it back on the queue for a live worker to finish.
    ghost = rt.enqueue("scripted", {"steps": 2, "result": {"note": "finished after reclaim"}})
    ids.append(ghost)
    while True:
        claimed = rt.store.claim(
            holder="worker:demo-ghost:0:dead",
            lease_ms=rt.settings.lease_ms,
            agents=["scripted"],
        )
        assert claimed is not None
        if claimed.run.id == ghost:
            break
    for i in range(plain_runs):
        ids.append(rt.enqueue("scripted", {"steps": 3, "sleep": 0.05 * (i % 3)}))
    retried = rt.enqueue(
        "scripted", {"steps": 3, "fail": {"class": "server_error", "at": 2, "times": 1}}
    )
    ids.append(retried)
    ids.append(rt.enqueue("scripted", {"steps": 3, "fail": {"class": "auth", "at": 1}}))
    ids.append(
        rt.enqueue(
            "scripted",
            {
                "steps": 2,
                "tool": {"effect": "non_idempotent_write", "at": 2},
            },
        )
    )
    asks = rt.enqueue("scripted", {"steps": 3, "approval": {"at": 2, "tools": ["send_email"]}})
    ids.append(asks)
    ids.extend(_enqueue_demo_agents(rt, console))
    doomed = rt.enqueue("scripted", {"steps": 2}, idempotency_key=f"demo-cancel-{time.time_ns()}")
    ids.append(doomed)
    rt.cancel(doomed, by="demo")
    console.print(
        f"queued {len(ids)} runs on {rt.backend}: one cancelled, one abandoned by a dead "
        "worker, some will ask for approval"
    )

    workers = [rt.worker(concurrency=4) for _ in range(2)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    reaper = rt.reaper()
    reaped = 0
    started = time.monotonic()
    with Progress(
        TextColumn("runs finished"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("runs", total=len(ids))
        while time.monotonic() - started < DEADLINE_S:
            done = sum(rt.get(i).status.is_terminal for i in ids)
            progress.update(task, completed=done)
            if done == len(ids):
                break
            reaped += reaper.reap_once(10).reaped
            for waiting in (i for i in ids if rt.get(i).status is RunStatus.WAITING_FOR_APPROVAL):
                pending = rt.pending(waiting)
                rt.approve(waiting, by="demo", digest=pending.digest)
                names = ", ".join(c.name for c in pending.calls)
                console.print(f"approved the pending {names} call of a waiting run")
            time.sleep(0.1)
    for w in workers:
        w.stop()
    for t in threads:
        t.join(timeout=10)
    rows = [rt.get(i) for i in ids]
    console.print(compact_runs_table(rows, title="Demo runs"))
    console.print(f"reaper reclaimed or dead-lettered {reaped} stale run(s)")
    print_run(console, rt.get(ghost), rt.history(ghost))
    console.print(f"try: steptrail show {retried}   (the retried run)")
    console.print(f"     steptrail show {asks}   (the approved run)")
    console.print(console_hint(rt.settings.database_url), markup=False)  # [console] is not markup
    return ids


def console_hint(database_url: str) -> str:
    """How to watch these runs in the operator console (the demo's last words)."""
    shown = re.sub(r"(//[^:/@]+):[^@/]*@", r"\1:***@", database_url)  # never echo a password
    where = "" if database_url == "sqlite:///steptrail.db" else f" --database-url {shown}"
    return (
        f"watch them in the console: steptrail{where} console   then open "
        "http://127.0.0.1:8765/   (needs: pip install 'steptrail[console]')"
    )


def _enqueue_demo_agents(rt: Runtime, console: Console) -> list[UUID]:
    """A run of the async demo agent and, with the pydantic-ai extra, of the pydantic-ai one
    (its report tool waits for the approval the demo gives)."""
    extra, notes = demo_agents()
    rt.app.include(extra)
    queued = [rt.enqueue("async_haiku", {})]
    if "weather_helper" in extra.agent_names:
        queued.append(rt.enqueue("weather_helper", {"prompt": "weather in Paris, then report"}))
    for note in notes:
        console.print(note, markup=False)
    return queued
