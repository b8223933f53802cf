"""The run index: one row per run, the read model workers claim from and the reaper scans.

A row is the run's folded state (`RunState`) plus the instants the store's clock gives it:
when the lease expires, when a queued run becomes claimable, when the run was created and
last changed. It is maintained in the same transaction as the events it folds (so a run is
claimable the moment its `Queued` commits, and two workers can never both hold it), and it
can be rebuilt from the log alone: `row_after` is the rule both paths follow (ADR 0004).

The hot fields are columns (status, version, holder, lease …) so that a claim can be a single
UPDATE; the rest of the state travels as a JSON document. `split_state` and `join_state`
convert between the two.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, NamedTuple
from uuid import UUID

from steptrail.domain.enums import RunStatus
from steptrail.domain.run import Run, RunEvent, RunState, apply

# State fields stored as columns of the index; everything else is in the JSON document.
COLUMN_FIELDS: tuple[str, ...] = (
    "run_id",
    "agent",
    "version",
    "status",
    "segment",
    "holder",
    "lease_ms",
    "claim_version",
    "requeue_count",
    "reason",
    "idempotency_key",
    "queue",
    "priority",
    "concurrency_key",
    "concurrency_limit",
)


def split_state(state: RunState) -> tuple[dict[str, Any], dict[str, Any]]:
    """(columns, document) of a state, both JSON-compatible."""
    data = state.model_dump(mode="json")
    columns = {k: data.pop(k) for k in COLUMN_FIELDS}
    return columns, data


def column_values(state: RunState) -> dict[str, Any]:
    """The column values of a state, as `split_state` gives them, without dumping the rest."""
    values: dict[str, Any] = {}
    for field in COLUMN_FIELDS:
        value = getattr(state, field)
        if type(value) not in _PLAIN:
            value = value.value if isinstance(value, Enum) else str(value)
        values[field] = value
    return values


# Column values written as they are; the rest (enums, the UUID) become their JSON form.
_PLAIN = frozenset({str, int, type(None)})


# The document's fields, serialised straight to JSON text by pydantic-core in one call (the
# append path writes it with every step; ADR 0039). A set, not a frozenset: pydantic-core
# takes a set as it is and converts anything else on every call.
_DOCUMENT_EXCLUDE: set[str] = set(COLUMN_FIELDS)
_STATE_SERIALIZER = RunState.__pydantic_serializer__


def document_json(state: RunState) -> str:
    """The JSON text of a state's document: the same content as `split_state`'s document."""
    return _STATE_SERIALIZER.to_json(state, exclude=_DOCUMENT_EXCLUDE).decode()


# Events whose fold changes no column of the index but `version`: a step, a pending-effect
# marker, a lease renewal and a replay note change only the document (and, by the row rule
# below, the lease and `updated_at`). An append of only these can rewrite just those parts of
# the row, which keeps the status, agent and creation indexes out of its commit (ADR 0039).
DOCUMENT_ONLY_EVENTS: tuple[type[RunEvent], ...] = (
    Run.StepRecorded,
    Run.EffectPending,
    Run.LeaseRenewed,
    Run.Replayed,
)


def document_only(events: Iterable[RunEvent]) -> bool:
    """Whether folding `events` leaves every column of the index but `version` as it was."""
    return all(type(e) in DOCUMENT_ONLY_EVENTS for e in events)


def join_state(columns: Mapping[str, Any], document: Mapping[str, Any]) -> RunState:
    """The state a row's columns and document describe."""
    return RunState.model_validate({**document, **{k: columns[k] for k in COLUMN_FIELDS}})


@dataclass(frozen=True)
class RunRow:
    """One row of the run index, with the store's instants."""

    state: RunState
    created_at: datetime
    updated_at: datetime
    lease_expires_at: datetime | None
    available_at: datetime | None

    @property
    def run_id(self) -> UUID:
        return self.state.run_id

    @property
    def status(self) -> RunStatus:
        return self.state.status


class IndexRange(NamedTuple):
    """One keyset range of run ids as `verify` compares it: the live rows that could be
    decoded, the rows rebuilt from the log, and why each live row that could not be decoded
    cannot, by run id (ADR 0066)."""

    live: list[RunRow]
    rebuilt: list[RunRow]
    unreadable: dict[UUID, str]


def row_after(previous: RunRow | None, state: RunState, at: datetime) -> RunRow:
    """The row once `state` was recorded at the store's instant `at`.

    * A running run's lease expires `lease_ms` after its latest append: every append by the
      holder is a heartbeat, and no foreign append leaves a run running.
    * A run becomes claimable `retry_delay_ms` after it entered the queue; a row that was
      already queued keeps its time (no event keeps a queued run queued today, but the rule
      must not depend on that).
    * A waiting run with a deadline becomes claimable `wake_after_ms` after the append that
      suspended it (ADR 0068); without one, never by itself.
    """
    lease_expires_at = None
    if state.status is RunStatus.RUNNING and state.lease_ms is not None:
        lease_expires_at = at + timedelta(milliseconds=state.lease_ms)
    available_at = None
    delay_ms = claimable_after_ms(state)
    if delay_ms >= 0:
        if previous is not None and previous.status is state.status and previous.available_at:
            available_at = previous.available_at
        else:
            available_at = at + timedelta(milliseconds=delay_ms)
    return RunRow(
        state=state,
        created_at=previous.created_at if previous is not None else at,
        updated_at=at,
        lease_expires_at=lease_expires_at,
        available_at=available_at,
    )


def claimable_after_ms(state: RunState) -> int:
    """How long after an append the claim may take the run it leaves in `state`: the retry
    delay of a queued run, the deadline of a waiting one; -1 for never by itself. The
    stores pass it to their append statements as `retry_delay_ms` (ADR 0068)."""
    if state.status is RunStatus.QUEUED:
        return state.retry_delay_ms
    if state.status.is_waiting and state.wake_after_ms is not None:
        return state.wake_after_ms
    return -1


def rebuild_row(recorded: Iterable[tuple[RunEvent, datetime]]) -> RunRow | None:
    """Fold a run's events, each with the instant it was recorded, into its index row."""
    row: RunRow | None = None
    for event, at in recorded:
        state = apply(row.state if row is not None else None, event)
        row = row_after(row, state, at)
    return row


def rebuild_rows(log: Iterable[tuple[UUID, RunEvent, datetime]]) -> Iterator[RunRow]:
    """Index rows from a log ordered by run, then version: one row per run, streamed."""
    current: UUID | None = None
    batch: list[tuple[RunEvent, datetime]] = []
    for run_id, event, at in log:
        if run_id != current and batch:
            if (row := rebuild_row(batch)) is not None:
                yield row
            batch = []
        current = run_id
        batch.append((event, at))
    if batch and (row := rebuild_row(batch)) is not None:
        yield row


def normalise(row: RunRow) -> RunRow:
    """The row with instants in UTC, so rows read from different backends compare equal."""

    def utc(value: datetime | None) -> datetime | None:
        if value is None:
            return None
        return value.astimezone(UTC)

    return replace(
        row,
        created_at=utc(row.created_at) or row.created_at,
        updated_at=utc(row.updated_at) or row.updated_at,
        lease_expires_at=utc(row.lease_expires_at),
        available_at=utc(row.available_at),
    )
