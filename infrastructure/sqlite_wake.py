"""SQLite: when an idle worker next has something to claim (ADR 0082).

A mixin of `SQLiteRunStore`: `next_due_in`, the seconds from the store's clock to the
earliest due time (`available_at`) among the runs a worker may claim. The same walk of the
claim index as the claim's (`sqlite_queues`, ADR 0077), on a read connection: the queues of
each agent, the priority levels of each queue, and each level's earliest run, one descent
each, so sleepers cost it nothing. Keyed runs (their own index, by key) are not looked at:
their wake-ups wait for the poll.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

# Above every priority a run can have (domain.queues.MAX_PRIORITY): the first level's bound.
_TOP = 2**62


class _Store(Protocol):
    q: Any

    def _read(self) -> AbstractContextManager[sqlite3.Cursor]: ...

    def now_us(self) -> int: ...


class SQLiteWake:
    """`next_due_in` on SQLite."""

    def next_due_in(
        self: _Store, *, agents: Sequence[str], queues: Sequence[str] | None = None
    ) -> float | None:
        """Seconds until the earliest due time among the claimable runs without a key of
        `agents` and `queues` (negative: passed), by the store's clock; None: none."""
        with self._read() as cur:
            earliest = min(
                (
                    at
                    for agent in dict.fromkeys(agents)
                    for queue in _queues(cur, self.q, agent, queues)
                    for at in _level_heads(cur, self.q, agent, queue)
                ),
                default=None,
            )
            now = self.now_us()
        return None if earliest is None else (earliest - now) / 1_000_000


def _queues(
    cur: sqlite3.Cursor, q: Mapping[str, str], agent: str, queues: Sequence[str] | None
) -> Iterator[str]:
    if queues is not None:
        yield from dict.fromkeys(queues)
        return
    after = ""
    while row := cur.execute(q["claim_queue_after"], {"agent": agent, "after": after}).fetchone():
        after = row[0]
        yield after


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
