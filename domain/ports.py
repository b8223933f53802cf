"""The ports the domain's callers need from a store, as structural protocols.

`workers/` and the facade are written against these; `infrastructure/` implements them for
SQLite and PostgreSQL, and one contract suite (tests/integration) holds both to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from steptrail.domain.journal import JournalEntry
from steptrail.domain.run import Run, RunEvent
from steptrail.domain.waits import Signal, SignalGuard


@dataclass(frozen=True)
class ClaimedRun:
    """A run a worker just claimed, with the request it was queued with, how old the run
    was at the claim by the store's clock (seconds since its creation), and its journal
    when the claim read it too (ADR 0086; None: not read, the segment reads it)."""

    run: Run
    request: bytes
    age_s: float | None = None
    journal: tuple[JournalEntry, ...] | None = None


@dataclass(frozen=True)
class ClaimRequest:
    """What a settle asks the store to claim in the same transaction (ADR 0058): up to
    `limit` queued runs of `agents` for `holder`, under a lease of `lease_ms`, exactly as
    `RunStore.claim_batch` would."""

    holder: str
    lease_ms: int
    agents: tuple[str, ...]
    limit: int = 1
    # The queues to claim from (ADR 0077); None: every queue.
    queues: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RecordedEvent:
    """One event as the log holds it: its version, the store's time of recording, and itself."""

    run_id: UUID
    version: int
    recorded_at: datetime
    event: RunEvent
    notification_id: int | None = None


class RunStore(Protocol):
    """Where runs live. Every write is one transaction, fenced on the run's version."""

    def create(self, run: Run, *, request: bytes | None) -> Run:
        """Record a new run's creation event (and its saved request, if any).

        Returns the run as stored: `run` itself, or, when its idempotency key is taken, the
        existing run with that key (nothing is written then).
        """
        ...

    def create_many(self, runs: Sequence[tuple[Run, bytes | None]]) -> list[UUID]:
        """Record many new runs (each with its saved request, if any) in one transaction, as
        `create` records each one, and wake idle workers once.

        Returns the id each run is stored under, in order: its own, or, when its idempotency
        key is taken (by an existing run or by an earlier run of `runs`), that run's.
        """
        ...

    def append(
        self,
        run: Run,
        *,
        resumable: bytes | None = None,
        then_claim: ClaimRequest | None = None,
        unless_signal: SignalGuard | None = None,
    ) -> list[ClaimedRun]:
        """Record `run`'s pending events at `run.committed_version + 1 …`, and the journal
        entries of its pending steps (none if the append completes or cancels the run: that
        settle deletes the run's journal and saved state in the same transaction; a failed
        run keeps its journal and request, and a `Retried` in mode `from` deletes the
        entries from its position on, in the same transaction, ADR 0070).

        With `then_claim`, the same transaction then claims runs as `claim_batch` would and
        returns them (ADR 0058): a settle hands its worker the next run without a round trip
        of its own. A store may claim fewer than asked, or none (always correct: the worker
        then claims as usual); it claims nothing when the append does not land. Without
        `then_claim` it returns an empty list.

        With `unless_signal`, the transaction first looks in the run's inbox with the row
        locked, and writes nothing if the guard's signal is there (ADR 0073).

        Raises:
            VersionConflict: somebody appended first; nothing was written.
            SignalArrived: `unless_signal` found its signal; nothing was written.
            StoreUnavailable: the store failed; the append may or may not have landed.
        """
        ...

    def next_signal(self, run_id: UUID, name: str, after_seq: int) -> Signal | None:
        """The first signal named `name` in the run's inbox numbered after `after_seq`."""
        ...

    def deliver_signal(
        self,
        run: Run,
        *,
        name: str,
        payload: bytes,
        sent_by: str,
        wake: Callable[[int], Run | None],
    ) -> int:
        """Store a signal for `run` (as loaded: fenced on `run.committed_version`) and return
        its number. In the same transaction, after the run's row is locked, `wake(seq)` may
        return the run with a pending `Woken`, which is appended too (ADR 0073).

        Raises:
            VersionConflict: the run moved on since it was loaded; nothing was written.
            UnknownRun: there is no such run.
        """
        ...

    def claim(
        self,
        *,
        holder: str,
        lease_ms: int,
        agents: Sequence[str],
        queues: Sequence[str] | None = None,
    ) -> ClaimedRun | None:
        """Claim the run `claim_batch` would claim first (a batch of one), if any."""
        ...

    def claim_batch(
        self,
        *,
        holder: str,
        lease_ms: int,
        agents: Sequence[str],
        limit: int,
        queues: Sequence[str] | None = None,
    ) -> list[ClaimedRun]:
        """Claim up to `limit` runs in one transaction (one round trip): of `queues` (None:
        every queue), the highest priority first, then the earliest available (ADR 0077)."""
        ...

    def load(self, run_id: UUID) -> Run | None: ...

    def saved(self, run_id: UUID, kind: str) -> bytes | None:
        """The saved `request` or `resumable` state of a run, or None once it was cleared."""
        ...

    def journal(self, run_id: UUID) -> list[JournalEntry]:
        """The run's step journal, in step order (empty once the run completed or was
        cancelled; a failed run keeps it until it is retried or purged)."""
        ...

    def stale(self, limit: int) -> list[Run]:
        """Running runs whose lease expired by the store's clock, oldest deadline first."""
        ...

    def history(
        self, run_id: UUID, *, first: int = 1, limit: int | None = None
    ) -> list[RecordedEvent]:
        """The run's events in order from version `first`, at most `limit` of them."""
        ...

    def held_back(
        self,
        *,
        agents: Sequence[str],
        queues: Sequence[str] | None = None,
        rate_horizon_s: float = 0.0,
    ) -> bool:
        """Whether a run of `agents` and `queues` with a concurrency key is due but waits
        for a place under its key's limit (ADR 0078), or sleeps on its rate limit's timer
        (`rate_limit:NAME`) and wakes within `rate_horizon_s` (ADR 0083)."""
        ...

    def wait_for_work(self, timeout: float) -> bool:
        """Block until new work may be claimable, or `timeout` seconds pass; whether it was
        woken (False: the timeout passed)."""
        ...

    def next_due_in(
        self, *, agents: Sequence[str], queues: Sequence[str] | None = None
    ) -> float | None:
        """Seconds from the store's clock to the earliest due time among the claimable runs
        of `agents` and `queues` (negative: passed; None: no such run). A keyed run's due
        time counts while it is to come, and once passed only if its key has a free place:
        a run held back by its key's limit is claimable only when a place frees. An idle
        worker waits no longer than this (ADR 0082, 0087)."""
        ...
