"""Your own projections: folds of run events into your application's tables.

A projection is a fold, like the built-in views: steptrail hands it each event of the log, in
the views' order (ADR 0012), together with an `EventContext` (run id, version, the store's
time of recording, the event's position) and a `Sql` handle on the transaction in which the
projection writes. steptrail commits what the projection wrote and the projection's tracking
position in that one transaction, a batch of events at a time, so every event is folded
exactly once however the runner dies (ADR 0028).

This module only defines the shape; it does no I/O. `infrastructure/projection_store.py`
runs the batches, `workers/projector.py` runs the loop.

Two ways to write one (the second is the eventsourcing library's habit):

    @app.projection("runs_per_agent", tables=("runs_per_agent",), create_tables=create)
    def runs_per_agent(event: RunEvent, ctx: EventContext) -> None: ...

    @app.projection("cost_per_agent_day")
    class CostPerAgentDay(steptrail.Projection):
        tables = ("cost_per_agent_day",)
        def create_tables(self, sql): ...
        def apply(self, event, ctx): ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from steptrail.domain.run import RunEvent

Position = tuple[int, int]


class Sql(Protocol):
    """A small SQL handle on the open transaction, the same on SQLite and PostgreSQL.

    Parameters are named `:name` on both backends (steptrail rewrites them for psycopg).
    Rows come back as dicts. `backend` is "sqlite" or "postgres", for the rare statement that
    must differ. Write portable SQL where you can: `INSERT … ON CONFLICT (…) DO UPDATE SET x =
    excluded.x` works on both.
    """

    backend: str

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None: ...
    def executemany(self, sql: str, params: Sequence[Mapping[str, Any]]) -> None: ...
    def fetchall(
        self, sql: str, params: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]: ...
    def fetchone(
        self, sql: str, params: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class Tracking:
    """Where a projection stands in the log (eventsourcing's `Tracking`, with a position that
    is a (transaction, id) pair rather than one notification id; ADR 0028)."""

    projection: str
    position: Position


@dataclass(frozen=True)
class EventContext:
    """What a projection gets beside the event: whose event, which version, when the store
    recorded it, where it stands in the log, and the transaction to write in."""

    run_id: UUID
    version: int
    recorded_at: datetime
    position: Position
    sql: Sql
    projection: str

    @property
    def tracking(self) -> Tracking:
        """The tracking record steptrail commits with this event's batch."""
        return Tracking(self.projection, self.position)


class Projection:
    """Base class of a projection (subclass it, or register a function instead).

    Attributes:
        name: the projection's name (`rebuild NAME`, `verify NAME`, metrics); set to the
            name it is registered under.
        tables: every table the projection owns; `rebuild` drops and recreates them,
            `verify` compares them with a rebuild into a scratch copy.
        topics: only events with these topics are handed to `apply` (all when empty); the
            position still moves past the others.
    """

    name: str = ""
    tables: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()

    def create_tables(self, sql: Sql) -> None:
        """Create the projection's tables if they do not exist (must be idempotent: `CREATE
        TABLE IF NOT EXISTS`). Runs once per process before the first batch, and inside the
        rebuild's transaction after the tables were dropped."""

    def apply(self, event: RunEvent, ctx: EventContext) -> None:
        """Fold one event into the projection's tables, through `ctx.sql`. Raising stops
        this projection (only it) at the start of the batch; see ADR 0030."""
        raise NotImplementedError

    def forget(self, run_ids: Sequence[UUID], sql: Sql) -> None:
        """Remove what the projection keeps of these runs: `purge` calls it in the very
        transaction that deletes them from the log, and no batch of this projection runs
        meanwhile. Keep no content of a purged run (ADR 0028). Default: nothing."""


class FunctionProjection(Projection):
    """A projection made of a function `apply(event, ctx)` and a `create_tables(sql)`."""

    def __init__(
        self,
        name: str,
        apply: Callable[[RunEvent, EventContext], None],
        *,
        tables: Sequence[str],
        create_tables: Callable[[Sql], None],
        topics: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.tables = tuple(tables)
        self.topics = tuple(topics)
        self._apply = apply
        self._create = create_tables

    def create_tables(self, sql: Sql) -> None:
        self._create(sql)

    def apply(self, event: RunEvent, ctx: EventContext) -> None:
        self._apply(event, ctx)


@dataclass(frozen=True)
class Failure:
    """Why a projection stopped: the event it could not fold, and the error."""

    position: Position
    run_id: UUID | None
    topic: str | None
    error: str
    failed_at: datetime | None
    attempts: int


class ProjectionFailed(Exception):
    """A projection raised on an event; its batch rolled back and it stands still."""

    def __init__(self, projection: str, failure: Failure) -> None:
        super().__init__(
            f"projection {projection!r} failed at position {failure.position} "
            f"({failure.topic}, run {failure.run_id}): {failure.error}"
        )
        self.projection = projection
        self.failure = failure


PurgeHook = tuple[str, Callable[[Sequence[UUID], Sql], None]]
"""(projection name, its `forget`): what `purge` calls inside each batch's transaction."""
