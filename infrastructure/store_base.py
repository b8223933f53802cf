"""What both backends' run stores share: turning states into row parameters and rows back
into runs, so the SQL is the only thing that differs between them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, Protocol, TypeVar
from uuid import UUID

from steptrail.domain.enums import RetryMode, RunStatus
from steptrail.domain.errors import DomainError, StoreUnavailable, UnreadableRun
from steptrail.domain.journal import JournalEntry
from steptrail.domain.ports import ClaimedRun, ClaimRequest
from steptrail.domain.run import Run, RunEvent, RunState
from steptrail.infrastructure.codec import encode_event, error_reason
from steptrail.infrastructure.logging import steptrail_logger
from steptrail.projections.run_index import (
    COLUMN_FIELDS,
    RunRow,
    claimable_after_ms,
    join_state,
    rebuild_row,
    split_state,
)

REQUEST = "request"
RESUMABLE = "resumable"
LOAD_SPACING = timedelta(milliseconds=1)  # between the events of one bulk-loaded run


class ReadOnlyStore(StoreUnavailable):
    """A write was asked of a store opened read-only (`?mode=ro`, or a file steptrail may
    not write). Only SQLite raises it; it lives here so that catching it (the CLI does)
    imports neither store."""


def listing_query(status: str | None, agent: str | None = None) -> str:
    """The query that lists runs (`runs`, the inbox) for a status and an agent filter: one
    whose index walk stops after the page (ADRs 0042, 0056). With a status, that status's
    index, or for an agent too the (status, agent) index; without one, the agent's index for
    an agent, else the creation index."""
    if status is None:
        return "select_runs" if agent is None else "select_runs_agent"
    if agent is not None:
        return "select_runs_agent_status"
    return "select_runs_running" if status == RunStatus.RUNNING.value else "select_runs_status"


def state_params(state: RunState) -> dict[str, Any]:
    """The run index parameters for `state` (columns, document, retry delay)."""
    columns, document = split_state(state)
    return {
        **columns,
        "doc": document,
        "retry_delay_ms": claimable_after_ms(state),
        # Written when the row is inserted (a child run's parent never changes; ADR 0075).
        "parent_id": state.parent_id,
    }


def encoded_events(run: Run) -> list[tuple[int, str, bytes]]:
    """(version, topic, state) of each pending event of `run`, in order."""
    first = run.committed_version + 1
    return [(first + i, *encode_event(e)) for i, e in enumerate(run.pending_events)]


class RowLike(Protocol):
    """A database row readable by column name (a psycopg dict row or an sqlite3.Row)."""

    def __getitem__(self, key: str, /) -> Any: ...


def run_from_row(row: RowLike) -> Run:
    """The run a row of the index describes."""
    document = row["doc"]
    if isinstance(document, (str, bytes)):
        document = json.loads(document)
    return Run(join_state({k: row[k] for k in COLUMN_FIELDS}, document))


# What decoding a damaged row raises: JSON that does not parse and a state that does not
# validate (ValueError, pydantic's ValidationError among them), a document that is not an
# object (TypeError), one nested past the interpreter's limit, a key that is missing.
UNREADABLE_ROW = (ValueError, TypeError, RecursionError, LookupError)

T = TypeVar("T")
R = TypeVar("R")


def readable_run(
    run_id: UUID, decode: Callable[[], Run], events: Callable[[UUID], Iterable[RunEvent]]
) -> Run:
    """The run `decode` reads from its row of the run index or, if the row cannot be decoded
    (damaged, edited by hand), the run its log describes: the index is a projection of the
    log (ADR 0066). The run's next append writes its row again from that state; until then
    each read logs `run_row_unreadable`, and `verify` reports the row.

    Raises:
        UnreadableRun: neither the row nor the log can be read (the message names the run).
    """
    try:
        return decode()
    except UNREADABLE_ROW as error:
        reason = error_reason(error)
    try:
        run = Run.replay(events(run_id))
    except (DomainError, *UNREADABLE_ROW) as error:
        raise UnreadableRun(
            f"run {run_id}: its row in the run index cannot be read ({reason}), and its log "
            f"cannot be replayed ({error_reason(error)})"
        ) from None
    steptrail_logger().warning(
        "run_row_unreadable",
        run_id=str(run_id),
        version=run.version,
        reason=reason,
        remedy="read from the log instead; `steptrail rebuild run-index` rewrites the row",
    )
    return run


def skip_unreadable(
    decode: Callable[[T], R],
    items: Iterable[T],
    skipped: Callable[[T], None] | None = None,
) -> list[R]:
    """`decode` of each item, leaving out (logged, and passed to `skipped`) those that raise
    `UnreadableRun`: a worker's claim or a reaper's pass goes on with the runs it can read,
    instead of one bad run failing every batch it is in (ADR 0066)."""
    decoded = []
    for item in items:
        try:
            decoded.append(decode(item))
        except UnreadableRun as error:
            steptrail_logger().error("run_unreadable_skipped", error=str(error))
            if skipped is not None:
                skipped(item)
    return decoded


class LookedPast:
    """Runs unreadable both ways that the reaper's scan found, remembered for a while so
    that later passes look past them (ADR 0066).

    The scan returns the oldest stale leases first, and such a run stays at the head of that
    order: without this, `limit` of them would fill every pass and no other stale run would be
    reaped. A pass asks for `limit` more rows than it remembers and drops the remembered ones
    before decoding, so they cost neither a read of their log nor a log line. Each is tried
    (and logged) again once `ttl_s` has passed: a newer steptrail or an operator may have
    dealt with it. At most `most` are remembered (a pass then asks for at most that many
    more rows); the ones that would go over are tried at every pass, as before.
    """

    def __init__(self, ttl_s: float = 300.0, most: int = 1000) -> None:
        self._ttl_s = ttl_s
        self._most = most
        self._until: dict[UUID, float] = {}
        self._lock = threading.Lock()

    def remembered(self) -> frozenset[UUID]:
        """The run ids to look past now (forgetting those whose time is up)."""
        now = time.monotonic()
        with self._lock:
            for run_id in [r for r, until in self._until.items() if until <= now]:
                del self._until[run_id]
            return frozenset(self._until)

    def add(self, run_id: UUID) -> None:
        with self._lock:
            if len(self._until) < self._most:
                self._until[run_id] = time.monotonic() + self._ttl_s

    def scan(
        self,
        rows: Sequence[T],
        run_id: Callable[[T], UUID],
        decode: Callable[[T], R],
        past: frozenset[UUID],
        limit: int,
    ) -> list[R]:
        """The first `limit` of `rows` not in `past` (read before this scan asked for its
        rows), decoded; those unreadable both ways are left out, logged and remembered."""
        fresh = [row for row in rows if run_id(row) not in past][:limit]
        return skip_unreadable(decode, fresh, lambda row: self.add(run_id(row)))


def split_unreadable(
    decode: Callable[[T], R], rows: Iterable[T], run_id: Callable[[T], UUID]
) -> tuple[list[R], dict[UUID, str]]:
    """`decode` of each row that can be decoded, and why the others cannot, by run id: what
    `verify` compares and what it reports as unreadable (ADR 0066)."""
    decoded: list[R] = []
    unreadable: dict[UUID, str] = {}
    for row in rows:
        try:
            decoded.append(decode(row))
        except UNREADABLE_ROW as error:
            unreadable[run_id(row)] = error_reason(error)
    return decoded, unreadable


@lru_cache(maxsize=64)
def claimed_event(holder: str, lease_ms: int) -> tuple[str, bytes]:
    """(topic, state) of the Claimed event a claim by `holder` appends to every run it takes:
    it does not depend on the run, and a worker claims with one holder and one lease, so it
    is encoded once per worker rather than once per claim."""
    return encode_event(Run.Claimed(actor=holder, lease_ms=lease_ms))


class Claims:
    """`claim_batch` and `claim` as both stores take them: the arguments become one
    `ClaimRequest` (what a settle's claim also carries, ADR 0058), which the backend's
    `_claim` serves in one transaction."""

    def claim_batch(
        self,
        *,
        holder: str,
        lease_ms: int,
        agents: Sequence[str],
        limit: int,
        queues: Sequence[str] | None = None,
    ) -> list[ClaimedRun]:
        request = ClaimRequest(
            holder=holder,
            lease_ms=lease_ms,
            agents=tuple(agents),
            limit=limit,
            queues=None if queues is None else tuple(queues),
        )
        return self._claim(request)

    def _claim(self, request: ClaimRequest) -> list[ClaimedRun]:
        raise NotImplementedError

    def claim(
        self,
        *,
        holder: str,
        lease_ms: int,
        agents: Sequence[str],
        queues: Sequence[str] | None = None,
    ) -> ClaimedRun | None:
        claimed = self.claim_batch(
            holder=holder, lease_ms=lease_ms, agents=agents, limit=1, queues=queues
        )
        return claimed[0] if claimed else None


class WakesIdleWorkers:
    """How both stores wake an idle worker of this process: an event that a write leaving a
    run queued sets after its commit (`wake_here`), that a finished segment sets (`wake`) and
    that the idle dispatcher waits on (`wait_for_work`). How other processes are woken is
    each backend's own: SQLite shares the event between the stores of one database in a
    process, PostgreSQL also LISTENs (its `wait_for_work` starts the listener first)."""

    _woken: threading.Event

    def wait_for_work(self, timeout: float) -> bool:
        woken = self._woken.wait(timeout)
        self._woken.clear()
        return woken

    def wake(self) -> None:
        self._woken.set()

    def wake_here(self, run: Run) -> None:
        """After a committed write of `run`: wake this process's idle worker if it is queued."""
        if side_effects(run.state)[1]:
            self._woken.set()


def side_effects(state: RunState) -> tuple[bool, bool]:
    """(drop saved state, notify idle workers) for a run that has just become `state`.

    Settling drops the saved request and resumable state in the same transaction, which is
    how they are "cleared" although the log itself is never rewritten (ADR 0008); a failed
    run keeps its request (see `keeps_request`).
    """
    return state.status.is_terminal, state.status is RunStatus.QUEUED


def keeps_request(state: RunState) -> bool:
    """Whether a settle leaves the saved request and the step journal in place: a *failed*
    run keeps both until it is purged or retried, so that an operator can put it back on
    the queue (ADR 0025) and the retry resumes from the journal instead of repeating what
    it recorded (ADRs 0068 §4, 0070). Its other saved state is dropped as usual, and so is
    the journal of a failed run with no request to be retried with (an interactive run):
    the journal is kept exactly when the request is (`drop_saved_but_request`)."""
    return state.status is RunStatus.FAILED


def pending_entries(run: Run) -> tuple[tuple[int, JournalEntry], ...]:
    """(step seq, entry) of the journal entries to write with `run`'s pending events: none
    when the append completes or cancels the run, since that settle deletes the journal in
    the same transaction (ADR 0013); a failed run's are written, as it keeps its journal
    (`keeps_request`): the steps a failing segment recorded last (batched model calls, the
    step that raised) are what its retry replays or runs again."""
    pending = run.pending_journal
    if not pending:
        return ()
    state = run.state
    if state.status.is_terminal and not keeps_request(state):
        return ()
    return pending


def journal_cut(run: Run) -> int | None:
    """The position from which the append deletes `run`'s journal entries: that of a
    pending `Retried` in mode `from` (`retry --from N`, ADR 0070), so the steps from
    there on run again; None (nothing deleted) otherwise. The deletion rides in the same
    fenced transaction as the event: a retry that loses the race deletes nothing."""
    for event in run.pending_events:
        if type(event) is Run.Retried and event.mode is RetryMode.FROM:
            return event.position
    return None


def journal_rows(run: Run) -> list[dict[str, Any]]:
    """The journal rows to write with `run`'s pending events (`pending_entries`), by column."""
    return [
        {
            "seq": seq,
            "position": e.position,
            "kind": e.kind,
            "name": e.name,
            "fingerprint": e.fingerprint,
            "outcome": e.outcome(),
        }
        for seq, e in pending_entries(run)
    ]


def journal_from_rows(rows: Sequence[RowLike]) -> list[JournalEntry]:
    """Journal entries from rows of `select_journal`, in step order."""
    return [
        JournalEntry.from_row(
            seq=int(r["seq"]),
            position=int(r["position"]),
            kind=r["kind"],
            name=r["name"],
            fingerprint=r["fingerprint"],
            outcome=bytes(r["outcome"]),
        )
        for r in rows
    ]


def settled_load(run: Run, at: datetime) -> tuple[list[tuple[int, str, bytes, datetime]], RunRow]:
    """For the stores' `bulk_load_settled` (benchmark databases only, ADR 0044): each
    pending event of a new, settled `run` (its whole life) with the instant it is recorded
    (`at`, then `LOAD_SPACING` apart), and the index row that a rebuild folds from them, so
    that `verify` finds the loaded index equal to the log."""
    assert run.committed_version == 0, "a bulk-loaded run is new"
    assert run.state.status.is_terminal, "a bulk-loaded run is settled"
    instants = [at + i * LOAD_SPACING for i in range(len(run.pending_events))]
    events = [
        (v, t, s, when) for (v, t, s), when in zip(encoded_events(run), instants, strict=True)
    ]
    row = rebuild_row(zip(run.pending_events, instants, strict=True))
    assert row is not None
    return events, row


# Keyset ranges of run ids for `verify` and `rebuild run-index` (ADR 0040): inclusive bounds,
# from the smallest id to the largest, each range holding at most `RANGE_RUNS` rows of the
# index and `RANGE_RUNS` events of the log (plus the rest of its last run's events).
RANGE_RUNS = 2000
# A rebuild range is smaller: writers wait for it (on SQLite every writer, under the one
# write lock; on PostgreSQL the writers of its runs, on their rows), and a worker whose
# append waits for half a lease fences itself (ADR 0007), so a range must take tens of
# milliseconds, not seconds, even on a loaded machine.
REBUILD_RANGE = 500
FIRST_ID = UUID(int=0)
LAST_ID = UUID(int=(1 << 128) - 1)


def range_end(candidates: Sequence[UUID | None]) -> UUID:
    """Where a range ends: the nearest of the candidate ends (the index's, the log's), or
    the largest id if neither has that many runs left (the last range)."""
    found = [c for c in candidates if c is not None]
    return min(found) if found else LAST_ID


def after(run_id: UUID) -> UUID | None:
    """The id a range that ends at `run_id` is followed from (None after the last)."""
    return UUID(int=run_id.int + 1) if run_id != LAST_ID else None
