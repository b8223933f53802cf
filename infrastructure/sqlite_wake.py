"""SQLite: when an idle worker next has something to claim (ADR 0082).

A mixin of `SQLiteRunStore`: `next_due_in`, the seconds from the store's clock to the
earliest due time (`available_at`) among the runs a worker may claim. The same walk of the
claim index as the claim's (`sqlite_queues`, ADR 0077), on a read connection: the queues of
each agent, the priority levels of each queue, and each level's earliest run, one descent
each, so sleepers cost it nothing. Keyed runs (ADR 0087) by their own due index (migration
0038), per (agent, queue): the earliest due time still to come, one descent; and a due time
passed only if its key has a free place, among the `KEYED_RECENT` latest due, so a run held
back by its key's limit does not make the worker claim again at once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

# Above every priority a run can have (domain.queues.MAX_PRIORITY): the first level's bound.
_TOP = 2**62
# How many of an (agent, queue)'s latest due keyed runs are looked at for one whose key has
# a free place (as steptrail_next_due, migration 0038): a held-back backlog costs no more.
KEYED_RECENT = 32


class _Store(Protocol):
    q: Any

    def _read(self) -> AbstractContextManager[sqlite3.Cursor]: ...

    def now_us(self) -> int: ...


class SQLiteWake:
    """`next_due_in` on SQLite."""

    def next_due_in(
        self: _Store, *, agents: Sequence[str], queues: Sequence[str] | None = None
    ) -> float | None:
        """Seconds until the earliest due time among the claimable runs of `agents` and
        `queues` (negative: passed; a keyed run's only if its key has a free place), by the
        store's clock; None: none."""
        with self._read() as cur:
            now = self.now_us()
            unique = list(dict.fromkeys(agents))
            plain = (
                at
                for agent in unique
                for queue in _queues(cur, self.q, agent, queues)
                for at in _level_heads(cur, self.q, agent, queue)
            )
            keyed = (
                at
                for agent in unique
                for queue in _queues(cur, self.q, agent, queues, "keyed_due_queue_after")
                for at in _keyed_due(cur, self.q, agent, queue, now)
            )
            earliest = min((*plain, *keyed), default=None)
            now = self.now_us()
        return None if earliest is None else (earliest - now) / 1_000_000


def _queues(
    cur: sqlite3.Cursor,
    q: Mapping[str, str],
    agent: str,
    queues: Sequence[str] | None,
    walk: str = "claim_queue_after",
) -> Iterator[str]:
    """The queues asked for, or those of the agent's runs in the index `walk` descends."""
    if queues is not None:
        yield from dict.fromkeys(queues)
        return
    after = ""
    while row := cur.execute(q[walk], {"agent": agent, "after": after}).fetchone():
        after = row[0]
        yield after


def _keyed_due(
    cur: sqlite3.Cursor, q: Mapping[str, str], agent: str, queue: str, now: int
) -> Iterator[int]:
    """An (agent, queue)'s earliest keyed due time to come, and its latest passed one whose
    key has a free place (ADR 0087)."""
    params = {"agent": agent, "queue": queue, "now": now, "recent": KEYED_RECENT}
    for name in ("keyed_next_due_at", "keyed_came_due_at"):
        row = cur.execute(q[name], params).fetchone()
        if row is not None and row[0] is not None:
            yield int(row[0])


def _level_heads(
    cur: sqlite3.Cursor, q: Mapping[str, str], agent: str, queue: str
) -> Iterator[int]:
    """The earliest due time of each priority level of (agent, queue)."""
    below = _TOP
    while True:
        level = cur.execute(
            q["claim_level_below"], {"agent": agent, "queue": queue, "below": below}
        ).fetchone()
        if level is None:
            return
        below = level[0]
        head = cur.execute(
            q["next_due_at"], {"agent": agent, "queue": queue, "priority": below}
        ).fetchone()
        if head is not None:
            yield int(head[0])
