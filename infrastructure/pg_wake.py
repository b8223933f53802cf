"""PostgreSQL: when an idle worker next has something to claim (ADR 0082).

A mixin of `PostgresRunStore`: `next_due_in`, the seconds from the server's clock to the
earliest due time (`available_at`) among the runs a worker may claim, by `steptrail_next_due`
(migrations 0037 and 0038), a loose walk of the claim index and of the keyed due index:
sleepers cost it nothing, and a keyed run held back by its key's limit does not count (ADR
0087).

A write of this store that left a run queued also wakes this process's idle worker at once
(`wake_here`, shared with SQLite in `store_base.WakesIdleWorkers`), instead of after the
NOTIFY's trip through the server and the listener thread (about a millisecond of enqueue ->
start). The NOTIFY the same write sends at commit still wakes every other process; this only
comes first, after the commit, so a worker woken here finds the run committed and claims it
through the same fenced claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from psycopg.rows import DictRow


class _Store(Protocol):
    def _one(self, name: str, params: dict[str, Any]) -> DictRow | None: ...


class PostgresWake:
    """`next_due_in` on PostgreSQL."""

    def next_due_in(
        self: _Store, *, agents: Sequence[str], queues: Sequence[str] | None = None
    ) -> float | None:
        """Seconds until the earliest due time among the claimable runs of `agents` and
        `queues` (negative: passed; a keyed run's only if its key has a free place), by the
        server's clock; None: none."""
        row = self._one(
            "next_due",
            {
                "agents": list(dict.fromkeys(agents)),
                "queues": None if queues is None else list(dict.fromkeys(queues)),
            },
        )
        due = None if row is None else row["due_in_s"]
        return None if due is None else float(due)
