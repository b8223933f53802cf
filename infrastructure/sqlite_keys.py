"""The SQLite claim's walk of concurrency keys (ADR 0078).

Inside the claim's write transaction (nobody else can write, so the counts read are the
counts at commit): the keys with a free place and runs to take, least recently served first,
and each key's due runs of the worker's agents and queues up to its free places, until the
batch is full. A key that gives nothing goes to the back; a served key goes to the back by
the run index's trigger when its run is claimed (`claim_rows`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping

from steptrail.domain.ports import ClaimRequest


def pick_keyed(
    cur: sqlite3.Cursor, q: Mapping[str, str], request: ClaimRequest, now: int
) -> list[sqlite3.Row]:
    """Up to `request.limit` claimable keyed rows, no key over its limit."""
    limit = request.limit
    keys = cur.execute(q["claim_keys_ready"], {"limit": limit}).fetchall()
    if not keys:
        return []
    agents = json.dumps(list(dict.fromkeys(request.agents)))
    queues = None if request.queues is None else json.dumps(list(request.queues))
    rows: list[sqlite3.Row] = []
    for key, free in keys:
        if len(rows) >= limit:
            break
        found = cur.execute(
            q["claim_keyed"],
            {
                "key": key,
                "now": now,
                "agents": agents,
                "queues": queues,
                "limit": min(free, limit - len(rows)),
            },
        ).fetchall()
        if not found:
            cur.execute(q["rotate_key"], {"key": key})
        rows += found
    return rows
