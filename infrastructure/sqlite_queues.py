"""The SQLite claim's walk of queues and priority levels (ADR 0077).

Inside the claim's write transaction (nobody else can write), for each agent and each queue
the worker serves (every queue the agent has claimable runs in, when it names none): the
priority levels from the highest, one descent of the claim index each, and each level's runs
from the one that became claimable first, until the batch is full. A level's runs whose time
has not come sit after `now` in the index and are never read. The pairs' batches are merged
by (priority descending, available_at, run_id): the order PostgreSQL's claim gives, with
the keyed runs `sqlite_keys` picks (ADR 0078).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence

from steptrail.domain.ports import ClaimRequest
from steptrail.infrastructure.sqlite_keys import pick_keyed

# Above every priority a run can have (domain.queues.MAX_PRIORITY): the first level's bound.
_TOP = 2**62


def pick(
    cur: sqlite3.Cursor, q: Mapping[str, str], request: ClaimRequest, now: int
) -> list[sqlite3.Row]:
    """Up to `request.limit` claimable rows of `request`'s agents and queues, in claim order."""
    limit = request.limit
    rows: list[sqlite3.Row] = []
    pairs = 0
    for agent in dict.fromkeys(request.agents):
        for queue in _queues(cur, q, agent, request.queues):
            pairs += 1
            rows += _walk(cur, q, agent, queue, limit=limit, now=now)
    keyed = pick_keyed(cur, q, request, now)  # runs with a concurrency key (ADR 0078)
    rows += keyed
    if pairs > 1 or keyed:  # each pair's batch is in claim order; merge them
        rows = sorted(rows, key=lambda r: (-r["priority"], r["available_at"], r["run_id"]))
        rows = rows[:limit]
    return rows


def _queues(
    cur: sqlite3.Cursor, q: Mapping[str, str], agent: str, queues: Sequence[str] | None
) -> list[str]:
    if queues is not None:
        return list(dict.fromkeys(queues))
    found: list[str] = []
    after = ""
    while True:
        row = cur.execute(q["claim_queue_after"], {"agent": agent, "after": after}).fetchone()
        if row is None:
            return found
        after = row[0]
        found.append(after)


def _walk(
    cur: sqlite3.Cursor, q: Mapping[str, str], agent: str, queue: str, *, limit: int, now: int
) -> list[sqlite3.Row]:
    rows: list[sqlite3.Row] = []
    below = _TOP
    while len(rows) < limit:
        level = cur.execute(
            q["claim_level_below"], {"agent": agent, "queue": queue, "below": below}
        ).fetchone()
        if level is None:
            break
        below = level[0]
        cur.execute(
            q["claim"],
            {
                "agent": agent,
                "queue": queue,
                "priority": below,
                "limit": limit - len(rows),
                "now": now,
            },
        )
        rows += cur.fetchall()
    return rows
