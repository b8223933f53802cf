"""What each console page shows, gathered from the reporting views and the log.

Plain functions over a `Runtime`, with no web framework in them, so that the routes in
`app` stay thin and these can be read (and tested) on their own. Nothing here reads a
worker: the views, the run index and the log are the only sources (ADR 0025).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from markupsafe import Markup

from steptrail.console import charts
from steptrail.console.forms import Field, fields_for
from steptrail.domain.enums import RunStatus, TerminationReason, WaitKind
from steptrail.domain.errors import DomainError
from steptrail.domain.ports import RecordedEvent
from steptrail.domain.retry_plan import RetryPlan
from steptrail.domain.run import Run, RunState, fold
from steptrail.infrastructure.reporting_store import PageKey
from steptrail.projections.reporting import DeadLetterRow, RunSummary
from steptrail.runtime import Runtime
from steptrail.runtime_views import Family
from steptrail.workers.decisions import PendingDecision

PAGE_SIZE = 50
AGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
STATUSES = tuple(s.value for s in RunStatus)
REASONS = tuple(r.value for r in TerminationReason)
# Fields the timeline shows apart (or not at all) rather than among an event's details.
_APART = {"run_id", "payload", "result", "privacy", "request_digest", "actor"}


class BadFilter(ValueError):
    """A runs-page filter that names no status, reason, age or page."""


@dataclass(frozen=True)
class Filters:
    status: str | None = None
    agent: str | None = None
    reason: str | None = None
    age: str | None = None
    after: PageKey | None = None

    @classmethod
    def parse(cls, query: dict[str, str]) -> Filters:
        """Raises BadFilter for a value outside the known ones."""
        status = query.get("status") or None
        reason = query.get("reason") or None
        age = query.get("age") or None
        if status is not None and status not in STATUSES:
            raise BadFilter(f"unknown status {status!r}")
        if reason is not None and reason not in REASONS:
            raise BadFilter(f"unknown reason {reason!r}")
        if age is not None and age not in AGES:
            raise BadFilter(f"unknown age {age!r}")
        after = None
        if query.get("after"):
            try:
                after = PageKey.decode(query["after"])
            except ValueError as error:
                raise BadFilter(str(error)) from None
        return cls(status, query.get("agent") or None, reason, age, after)

    def query(self, **changes: str | None) -> dict[str, str]:
        """These filters as URL parameters (without the page key), with `changes`."""
        base = {"status": self.status, "agent": self.agent, "reason": self.reason, "age": self.age}
        base.update(changes)
        return {k: v for k, v in base.items() if v}


@dataclass
class RunsPage:
    filters: Filters
    rows: list[RunSummary]
    next_key: str | None
    totals: dict[str, int]
    agents: list[str]
    now: datetime


def runs_page(rt: Runtime, filters: Filters, *, limit: int = PAGE_SIZE) -> RunsPage:
    views = rt.views
    now = views.health().now
    since = now - AGES[filters.age] if filters.age else None
    rows = views.runs_page(
        status=filters.status,
        agent=filters.agent,
        reason=filters.reason,
        since=since,
        after=filters.after,
        limit=limit + 1,
    )
    next_key = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1]
        assert last.created_at is not None
        next_key = PageKey(last.created_at, last.run_id).encode()
    counts = views.status_counts()
    totals: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for (agent, status), n in counts.items():
        if filters.agent is None or agent == filters.agent:
            totals[status] = totals.get(status, 0) + n
    agents = sorted({a for a, _ in counts})
    return RunsPage(filters, rows, next_key, totals, agents, now)


@dataclass
class TimelineEntry:
    version: int
    at: datetime
    since_previous_ms: int | None
    name: str
    actor: str
    details: list[tuple[str, str]]
    body: str | None
    kind: str


def timeline(events: list[RecordedEvent]) -> list[TimelineEntry]:
    """The trail as the run page shows it: each event with the time since the one before."""
    entries = []
    previous: datetime | None = None
    for recorded in events:
        event = recorded.event
        data = event.model_dump(mode="json")
        details = [
            (k, v if isinstance(v, str) else json.dumps(v))
            for k, v in data.items()
            if k not in _APART and v not in (None, (), [], {}, False)
        ]
        body = None
        if isinstance(event, Run.StepRecorded) and event.payload:
            body = json.dumps(event.payload, indent=2, sort_keys=True)
        elif isinstance(event, Run.Completed) and event.result:
            body = json.dumps(event.result, indent=2, sort_keys=True)
        if isinstance(event, (Run.StepRecorded, Run.Completed)):
            details.append(("privacy", event.privacy.value))
        gap = None
        if previous is not None:
            gap = int((recorded.recorded_at - previous).total_seconds() * 1000)
        previous = recorded.recorded_at
        entries.append(
            TimelineEntry(
                version=recorded.version,
                at=recorded.recorded_at,
                since_previous_ms=gap,
                name=type(event).__name__,
                actor=event.actor,
                details=details,
                body=body,
                kind=_kind(event),
            )
        )
    return entries


def _kind(event: object) -> str:
    if isinstance(event, (Run.Failed, Run.DeadLettered)):
        return "bad"
    if isinstance(event, (Run.Completed,)):
        return "good"
    if isinstance(event, (Run.Suspended, Run.Decided, Run.Cancelled, Run.Retried)):
        return "human"
    if isinstance(event, (Run.Requeued, Run.Reclaimed, Run.EffectPending)):
        return "warn"
    return "plain"


@dataclass
class Decision:
    """What a waiting run asks, ready for a form."""

    pending: PendingDecision
    fields: list[Field] = field(default_factory=list)
    # An interactive run has no request to go back on the queue with, and the console never
    # runs an agent itself: such a run is decided from the process that started it.
    queueable: bool = True

    @property
    def is_approval(self) -> bool:
        return self.pending.kind is WaitKind.APPROVAL

    def calls_json(self) -> list[tuple[str, str]]:
        return [
            (c.name, json.dumps(c.arguments, indent=2, sort_keys=True)) for c in self.pending.calls
        ]


def decision(rt: Runtime, run_id: UUID, *, queueable: bool = True) -> Decision | str:
    """The pending decision of a waiting run, or why there is none to take."""
    try:
        pending = rt.pending(run_id)
    except DomainError as error:
        return str(error)
    fields = fields_for(pending.input_schema) if pending.kind is WaitKind.INPUT else []
    return Decision(pending, fields, queueable)


@dataclass
class RunPage:
    run_id: UUID
    state: RunState
    summary: RunSummary | None
    row: Any
    entries: list[TimelineEntry]
    at_version: int | None
    state_json: str
    decision: Decision | str | None
    request_kept: bool
    # What a retry would do (a failed run only): where it runs again, and the recorded
    # non-idempotent writes any retry from step 1 would repeat (what `force` is for).
    retry: RetryPlan | None = None
    recorded_writes: tuple[str, ...] = ()
    # Its parent and children (ADR 0075), as `show` lists them.
    family: Family | None = None


def run_page(rt: Runtime, run_id: UUID, at_version: int | None) -> RunPage:
    """Raises UnknownRun (with the purge tombstone, if any) and ValueError (no such version)."""
    events = rt.history(run_id)
    row = rt.get(run_id)
    state = fold(e.event for e in events)
    assert state is not None
    shown = state
    if at_version is not None:
        shown, _ = rt.audit(run_id, at_version)
    waiting = state.status.is_waiting and state.decision is None
    failed = state.status is RunStatus.FAILED
    return RunPage(
        run_id=run_id,
        state=state,
        summary=rt.views.summary(run_id),
        row=row,
        entries=timeline(events),
        at_version=at_version,
        state_json=json.dumps(shown.model_dump(mode="json"), indent=2, sort_keys=True),
        decision=decision(rt, run_id, queueable=state.has_saved_request) if waiting else None,
        request_kept=rt.store.saved(run_id, "request") is not None,
        retry=rt.retry_plan(run_id) if failed else None,
        recorded_writes=rt.retry_plan(run_id, from_position=1).rerun_writes if failed else (),
        family=rt.family(run_id),
    )


@dataclass
class InboxItem:
    summary: RunSummary
    decision: Decision | str


def inbox(rt: Runtime, *, limit: int = PAGE_SIZE) -> list[InboxItem]:
    """Runs waiting for a person, oldest first, each with what it asks."""
    items = []
    for status in (RunStatus.WAITING_FOR_APPROVAL, RunStatus.WAITING_FOR_INPUT):
        for summary in rt.views.runs_page(status=status.value, limit=limit):
            taken = decision(rt, summary.run_id, queueable=summary.state.has_saved_request)
            if isinstance(taken, str) and "not waiting" in taken:
                continue  # decided since the views last caught up
            items.append(InboxItem(summary, taken))
    items.sort(key=lambda i: i.summary.updated_at or datetime.min.replace(tzinfo=UTC))
    return items


def dead_letters(rt: Runtime, agent: str | None) -> list[DeadLetterRow]:
    return rt.views.open_dead_letters(limit=200, agent=agent)


@dataclass
class Overview:
    now: datetime
    totals: dict[str, int]
    oldest_queued_s: float | None
    stale_leases: int
    throughput_svg: Markup
    steps_svg: Markup
    ended_last_hour: int
    step_p50: float
    step_p95: float
    step_p99: float
    steps_seen: int


def overview(rt: Runtime, *, minutes: int = 60, step_sample: int = 5000) -> Overview:
    views = rt.views
    health = views.health()
    now = health.now
    totals: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for (_, status), n in views.status_counts().items():
        totals[status] = totals.get(status, 0) + n
    start = (now - timedelta(minutes=minutes - 1)).replace(second=0, microsecond=0)
    buckets = [start + timedelta(minutes=i) for i in range(minutes)]
    ended: dict[str, list[int]] = {s: [0] * minutes for s in ("completed", "failed", "cancelled")}
    for minute, status, n in views.throughput(start):
        i = int((minute - start).total_seconds() // 60)
        if 0 <= i < minutes and status in ended:
            ended[status][i] += n
    by_minute: dict[datetime, list[int]] = defaultdict(list)
    everything: list[int] = []
    for at, ms in views.recent_step_durations(step_sample):
        by_minute[at.astimezone(UTC).replace(second=0, microsecond=0)].append(ms)
        everything.append(ms)
    # The same minutes as the throughput chart, so the two line up; a minute without a
    # sampled step has no point.
    series: dict[str, list[float | None]] = {"p50": [], "p95": [], "p99": []}
    for t in buckets:
        values = sorted(by_minute.get(t, ()))
        for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            series[name].append(charts.percentile(values, q) if values else None)
    everything.sort()
    oldest = health.oldest_queued_at
    return Overview(
        now=now,
        totals=totals,
        oldest_queued_s=(now - oldest).total_seconds() if oldest else None,
        stale_leases=health.stale_leases,
        throughput_svg=charts.stacked_bars(buckets, ended, label="runs ended per minute"),
        steps_svg=charts.lines(buckets, series, label="step duration percentiles", unit="ms"),
        ended_last_hour=sum(sum(v) for v in ended.values()),
        step_p50=charts.percentile(everything, 0.5),
        step_p95=charts.percentile(everything, 0.95),
        step_p99=charts.percentile(everything, 0.99),
        steps_seen=len(everything),
    )
