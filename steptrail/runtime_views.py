"""The runtime's reads, views, retention and maintenance: a base of `Runtime`.

Split out of `steptrail/runtime.py` when that passed the house limit; the use cases that
write (enqueue, cancel, retry, decisions, signals) stay there. Every method that takes a
run accepts its id, its text, or a unique part of it (`resolve`, ADR 0074).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from uuid import UUID

from steptrail.domain.enums import RunStatus, TerminationReason
from steptrail.domain.errors import AmbiguousRunId, UnknownRun
from steptrail.domain.ids import CANDIDATES_SHOWN, run_reference
from steptrail.domain.run import fold
from steptrail.infrastructure.feed import read_feed
from steptrail.infrastructure.projection_store import ProjectionStore, tracked_statuses
from steptrail.infrastructure.reporting_store import ReportingStore
from steptrail.projections.custom import ProjectionFailed

if TYPE_CHECKING:
    import structlog

    from steptrail.domain.ports import RecordedEvent
    from steptrail.domain.rate_limits import RateLimitRow
    from steptrail.domain.run import RunState
    from steptrail.infrastructure.feed import FeedEntry
    from steptrail.infrastructure.postgres import PostgresRunStore
    from steptrail.infrastructure.projection_store import TrackedStatus
    from steptrail.infrastructure.settings import Settings
    from steptrail.infrastructure.sqlite import SQLiteRunStore
    from steptrail.projections.custom import Position
    from steptrail.projections.run_index import RunRow
    from steptrail.workers.projector import Projector
    from steptrail.workers.registry import App
    from steptrail.workers.retention import PurgeReport, RetentionPolicy

RunRef = UUID | str


@dataclass(frozen=True)
class Family:
    """A run's place in its family (ADR 0075): its parent's id (None: not a child), the
    parent as (id, agent, status) while it exists, whether it was purged, and the
    children as (id, agent, status), oldest first."""

    parent_id: UUID | None
    parent: tuple[UUID, str, RunStatus] | None
    parent_purged: bool
    children: list[tuple[UUID, str, RunStatus]]


class RuntimeViews:
    """What `Runtime` reads: runs, trails, views, projections; and retention, rebuild, verify."""

    app: App
    settings: Settings
    store: PostgresRunStore | SQLiteRunStore
    log: structlog.typing.FilteringBoundLogger
    _projections: dict[str, ProjectionStore]

    # -- finding runs ----------------------------------------------------------------------------

    def resolve(self, run: RunRef) -> UUID:
        """The id of the run `run` names: a UUID, its text (with or without dashes), or at
        least 8 hex digits of its start or of its end (the part tables show), if exactly
        one run has them (ADR 0074). A UUID is returned as is, without a read.

        Raises:
            InvalidRunId: not an id nor 8 or more of its hex digits.
            AmbiguousRunId: several runs match; the message lists some of them.
            UnknownRun: no run matches.
        """
        if isinstance(run, UUID):
            return run
        if not isinstance(run, str):
            raise TypeError(f"a run is named by a UUID or a string, not {type(run).__name__}")
        reference = run_reference(run)
        if isinstance(reference, UUID):
            return reference
        found = self.store.run_ids_like(reference, CANDIDATES_SHOWN + 1)
        if not found:
            raise UnknownRun(f"no run id starts or ends with {reference!r}")
        if len(found) > 1:
            shown = [str(u) for u in found[:CANDIDATES_SHOWN]]
            raise AmbiguousRunId(
                run.strip(), shown + (["…"] if len(found) > CANDIDATES_SHOWN else [])
            )
        return found[0]

    def rate_limits(self) -> list[RateLimitRow]:
        """Every rate limit the store keeps (those a worker stored at its start, ADR 0080),
        by name, with what its window (per + margin, ending now) holds and its block."""
        return self.store.rate_limit_rows()

    def runs(
        self,
        *,
        status: RunStatus | str | None = None,
        agent: str | None = None,
        reason: TerminationReason | str | None = None,
        limit: int = 50,
        before: RunRef | None = None,
        queue: str | None = None,
        min_priority: int | None = None,
    ) -> list[RunRow]:
        """Runs from the index, newest first, filtered (the inbox is `status=
        waiting_for_approval`); with `before`, the page after that run (the last row of
        the previous page): keyset pages, each costing what it returns (ADR 0042). `queue`
        and `min_priority` narrow the pages the other filters give (ADR 0077).

        Raises:
            UnknownRun: `before` names no run.
        """
        if limit < 1:
            raise ValueError("limit must be a positive integer")
        key = None
        if before is not None:
            before = self.resolve(before)
            row = self.get(before)
            key = (row.created_at, before)
        filters = {
            "status": RunStatus(status).value if status else None,
            "agent": agent,
            "reason": TerminationReason(reason).value if reason else None,
        }
        if queue is None and min_priority is None:
            return self.store.list_rows(limit=limit, before=key, **filters)
        from steptrail.workers.queues import list_placed

        return list_placed(
            self.store, queue=queue, min_priority=min_priority, limit=limit, before=key, **filters
        )

    def get(self, run_id: RunRef) -> RunRow:
        """The run as the index holds it.

        Raises:
            UnknownRun: no such run (the message says so if retention purged it).
        """
        run_id = self.resolve(run_id)
        row = self.store.row(run_id)
        if row is None:
            raise self._unknown(run_id)
        return row

    def history(
        self, run_id: RunRef, *, first: int = 1, limit: int | None = None
    ) -> list[RecordedEvent]:
        """The run's events in order, with the store's time of recording: every one, or
        from version `first`, at most `limit` of them (a page of a long trail, read by
        primary key: it costs what it returns). Empty past the run's last version.

        Raises:
            UnknownRun: no such run.
        """
        if first < 1 or (limit is not None and limit < 1):
            raise ValueError("first and limit must be positive integers")
        run_id = self.resolve(run_id)
        events = self.store.history(run_id, first=first, limit=limit)
        if not events and (first == 1 or self.store.row(run_id) is None):
            raise self._unknown(run_id)
        return events

    def family(self, run_id: RunRef) -> Family:
        """A run's parent and children (ADR 0075): each as (id, agent, status); a parent
        that was purged is named with `parent_purged` (its tombstone), never left out.

        Raises:
            UnknownRun: no such run.
        """
        run_id = self.resolve(run_id)
        row = self.store.row(run_id)
        if row is None:
            raise self._unknown(run_id)
        parent_id = row.state.parent_id
        parent: tuple[UUID, str, RunStatus] | None = None
        purged = False
        if parent_id is not None:
            found = self.store.row(parent_id)
            if found is not None:
                parent = (parent_id, found.state.agent, found.status)
            else:
                purged = self.store.tombstone(parent_id) is not None
        children = [(c.run_id, c.state.agent, c.status) for c in self.store.children(run_id)]
        return Family(parent_id, parent, purged, children)

    def _unknown(self, run_id: UUID) -> UnknownRun:
        tombstone = self.store.tombstone(run_id)
        if tombstone is None:
            return UnknownRun(f"no run {run_id}")
        category, purged_at = tombstone
        return UnknownRun(
            f"no run {run_id}: it was purged at {purged_at:%Y-%m-%d %H:%M:%S} "
            f"(retention category {category})"
        )

    # -- retention -------------------------------------------------------------------------------

    def retention_policy(self) -> RetentionPolicy:
        from steptrail.workers.retention import RetentionPolicy

        s = self.settings
        return RetentionPolicy(
            days=s.retention_days,
            agent_run_days=s.retention_agent_run_days,
            approval_days=s.retention_approval_days,
        )

    def purge(
        self,
        days: int | None = None,
        *,
        batch: int = 100,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> PurgeReport:
        """Remove every run past its retention window from every table, leaving tombstones.

        `days` (≥ 1) overrides every window. Works in batches of `batch` runs, each its own
        short transaction, in which each projection's `forget` removes what it keeps of
        them; an interrupted purge can simply be run again.
        """
        from steptrail.workers.retention import Purger

        stores = self.projections()
        for store in stores.values():  # `forget` may only touch tables that exist
            store.ensure_tables()
        purger = Purger(
            self.store,
            self.retention_policy(),
            batch=batch,
            log=self.log,
            projections=[(s.name, s.projection.forget) for s in stores.values()],
        )
        return purger.purge(days, progress=progress)

    # -- views, audit ----------------------------------------------------------------------------

    @property
    def views(self) -> ReportingStore:
        """The reporting views (run summaries, status counts, dead letters)."""
        return ReportingStore(self.store)

    def project(self, *, batch: int = 1000) -> int:
        """Bring the reporting views up to the log's head now; returns events folded."""
        return self.views.catch_up(batch=batch)

    def projector(self) -> Projector:
        """The runner of the reporting views and of every projection the app registered."""
        from steptrail.workers.projector import Projector

        return Projector(self.views, log=self.log, projections=list(self.projections().values()))

    # -- your projections, the feed ----------------------------------------------------------------

    def projections(self) -> dict[str, ProjectionStore]:
        """The tracked store of each projection the app registered, by name."""
        for name, projection in self.app.projections.items():
            if name not in self._projections:
                self._projections[name] = ProjectionStore(self.store, projection)
        return dict(self._projections)

    def projection(self, name: str) -> ProjectionStore:
        """One registered projection's store.

        Raises:
            ValueError: no projection of that name.
        """
        stores = self.projections()
        if name not in stores:
            known = ", ".join(sorted(stores)) or "none registered"
            raise ValueError(f"unknown projection {name!r} ({known})")
        return stores[name]

    def project_all(self, *, batch: int = 1000) -> dict[str, int | ProjectionFailed]:
        """Bring the reporting views and every projection up to the log's head now.

        Returns the events each folded, or the failure of a projection that raised (the
        others still ran). A store outage raises.
        """
        done: dict[str, int | ProjectionFailed] = {"reporting": self.project(batch=batch)}
        for name, store in self.projections().items():
            try:
                done[name] = store.catch_up(batch=batch)
            except ProjectionFailed as failed:
                done[name] = failed
        return done

    def tracked(self) -> list[TrackedStatus]:
        """Where each tracked projection stands — the reporting views and every projection
        that has ever run on this database, registered in this process's app or not:
        position, lag in events, and the failure that stopped it, if any."""
        return tracked_statuses(self.store)

    def events(self, *, after: Position = (0, 0), limit: int = 1000) -> list[FeedEntry]:
        """The next `limit` entries of the log after `after`, in the views' order: events,
        and markers of purged ones. Save the last entry's `position` to resume from."""
        return read_feed(self.store, after=after, limit=limit)

    def audit(self, run_id: RunRef, at_version: int) -> tuple[RunState, list[RecordedEvent]]:
        """The run's state as of `at_version`, and the events that led there.

        Raises:
            UnknownRun: no run has that id.
            ValueError: the run has no such version.
        """
        run_id = self.resolve(run_id)
        upto = self.history(run_id, limit=at_version)
        if len(upto) < at_version:
            raise ValueError(f"run {run_id} has versions 1 to {len(upto)}, not {at_version}")
        state = fold(e.event for e in upto)
        assert state is not None
        return state, upto

    def rebuild(
        self, view: str = "all", *, progress: Callable[[str, int, int], None] | None = None
    ) -> dict[str, int]:
        """Drop and rebuild views from the log: `run-index`, `reporting`, one of your
        projections by name, or `all` (every one of them).

        The run index is rebuilt in one transaction that pauses writers; the reporting
        views and projections are emptied and refolded batch by batch. Raises ValueError
        for another name, ProjectionFailed if a projection raises while refolding.
        """
        from steptrail.workers import maintenance

        stores = self.projections()
        if view in stores:
            return {view: self._rebuild_projection(stores[view], progress)}
        done = maintenance.rebuild(self.store, self.views, view, progress=progress)
        if view == "all":
            for store in stores.values():
                done[store.name] = self._rebuild_projection(store, progress)
        return done

    @staticmethod
    def _rebuild_projection(
        store: ProjectionStore, progress: Callable[[str, int, int], None] | None
    ) -> int:
        return store.rebuild(
            progress=(lambda n, total: progress(store.name, n, total)) if progress else None
        )

    def verify(self, view: str | None = None) -> list[str]:
        """Rebuild views in a scratch copy from the log and list how the live ones differ:
        every view (None), `run-index`, `reporting`, or one of your projections by name."""
        stores = self.projections()
        if view is None:
            problems = self.verify_index() + self.verify_views()
            for store in stores.values():
                problems += store.verify()
            return problems
        if view == "run-index":
            return self.verify_index()
        if view == "reporting":
            return self.verify_views()
        return self.projection(view).verify()

    def verify_index(self) -> list[str]:
        """Differences between the live run index and one rebuilt from the log."""
        from steptrail.workers import maintenance

        return maintenance.verify_index(self.store)

    def verify_views(self) -> list[str]:
        """Differences between the live reporting views and a scratch fold of the log."""
        from steptrail.workers import maintenance

        return maintenance.verify_views(self.views)
