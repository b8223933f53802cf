"""The runtime's enqueue use cases (ADR 0044, 0077): a base of `Runtime`.

Split out of `steptrail/runtime.py` when it passed the house limit again. The checks a
request goes through (its agent, model, size and depth, key, actor, queue and priority) are
module functions here, so the command line can run them before it opens a database
(ADR 0074) and the scheduler before it fires (ADR 0076).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from steptrail.domain.actors import check_actor
from steptrail.domain.digest import digest
from steptrail.domain.errors import InvalidActor
from steptrail.domain.limits import ENQUEUE_BATCH
from steptrail.domain.rate_limits import UnknownRateLimit
from steptrail.domain.run import Run
from steptrail.workers.registry import App, UnknownAgent
from steptrail.workers.requests import InvalidRequest as InvalidRequest  # noqa: PLC0414
from steptrail.workers.requests import encode_request
from steptrail.workers.requests import new_run_id as new_run_id  # noqa: PLC0414

# InvalidRequest and new_run_id moved to workers/requests.py for child runs (ADR 0075);
# they are re-exported here, where the runtime and the command line import them from.

if TYPE_CHECKING:
    import structlog

    from steptrail.infrastructure.postgres import PostgresRunStore
    from steptrail.infrastructure.settings import Settings
    from steptrail.infrastructure.sqlite import SQLiteRunStore
    from steptrail.workers.telemetry import CreationProbe, Telemetry

MAX_KEY_LENGTH = 1000
ITEM_FIELDS = (
    "agent", "request", "idempotency_key", "actor", "queue", "priority", "concurrency_key"
)  # fmt: skip
# A new run's (queue, priority, concurrency key, concurrency limit).
Placed = tuple[str, int, str | None, int | None]


class InvalidItem(InvalidRequest):
    """One item of `enqueue_many` cannot be enqueued; nothing was written. `index` is its
    position among the items (0-based), `reason` what is wrong with it."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"item {index}: {reason}")
        self.index = index
        self.reason = reason


class RuntimeEnqueue:
    """How `Runtime` puts runs on the queue."""

    app: App
    settings: Settings
    store: PostgresRunStore | SQLiteRunStore
    log: structlog.typing.FilteringBoundLogger
    telemetry: Telemetry

    def enqueue(
        self,
        agent: str,
        request: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        actor: str = "enqueue",
        queue: str | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
    ) -> UUID:
        """Queue a run of `agent`; returns its id (the existing run's, for a taken key).
        `queue` and `priority` default to the agent's (ADR 0077), `concurrency_key` too;
        the key's limit comes from `App.limit` or the agent (ADR 0078).

        Fail-closed: an unknown agent or a request that cannot be serialised (or does not
        validate against the agent's request model) raises before anything is written, and
        a failed write raises too.

        Raises:
            UnknownAgent: no agent of that name is registered.
            InvalidRequest: the request cannot be serialised or does not validate, or the
                queue or priority is not one the App accepts, or the concurrency key is
                malformed or has no limit.
            StoreUnavailable: the write failed.
        """
        return self.enqueue_once(
            agent,
            request,
            idempotency_key=idempotency_key,
            actor=actor,
            queue=queue,
            priority=priority,
            concurrency_key=concurrency_key,
        )[0]

    def enqueue_once(
        self,
        agent: str,
        request: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        actor: str = "enqueue",
        queue: str | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
    ) -> tuple[UUID, bool]:
        """`enqueue`, also saying whether the run is new (False: the idempotency key's run
        existed already and is returned)."""
        body = self._checked(agent, request, idempotency_key, actor)
        placed = placement(self.app, agent, queue, priority, concurrency_key)
        run, probe = self._new_queued(agent, body, idempotency_key, actor, placed)
        stored: Run | None = None
        try:
            stored = self.store.create(run, request=body)
        finally:
            probe.ended(duplicate=stored is not None and stored is not run)
        self.log.info(
            "run_enqueued",
            run_id=str(stored.id),
            agent=agent,
            version=stored.version,
            duplicate=stored is not run,
            **trace_fields(stored),
        )
        return stored.id, stored is run

    def enqueue_many(
        self,
        items: Iterable[Mapping[str, Any]],
        *,
        actor: str = "enqueue",
        batch: int = ENQUEUE_BATCH,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[UUID]:
        """Queue many runs: each item a mapping with `agent`, and optionally `request`,
        `idempotency_key`, `actor` (default `actor`), `queue`, `priority` and
        `concurrency_key`, as `enqueue` takes them. Returns
        each item's run id, in order (the existing run's for a taken key).

        Every item is validated before anything is written: a bad one raises
        `InvalidItem` naming its position, and nothing is written. Then the runs are
        written `batch` at a time, each batch one statement (PostgreSQL) or one transaction
        (SQLite), with the rows, creation events and saved requests `enqueue` writes, and
        idle workers are woken once per batch. Idempotency keys behave as if the items were
        enqueued one by one in order: a taken key returns its run, and a key repeated in
        `items` returns the run of its first occurrence. A failure of the store part-way
        leaves the batches before it written (enqueueing again with keys is safe).
        `progress(done, total)` is called after each batch. The checked requests of all
        items are held in memory until written: for millions of runs, call it once per
        chunk of items (as `steptrail enqueue --from` does).

        Raises:
            InvalidItem: an item is bad (its `index` says which); nothing was written.
            StoreUnavailable: a batch's write failed (the batches before it are written).
        """
        if batch < 1:
            raise ValueError("batch must be a positive integer")
        check_actor(actor)
        checked = self._checked_items(items, actor)
        first: dict[str, int] = {}  # idempotency key -> the first item that has it
        unique: list[int] = []
        for index, (_, _, key, _, _) in enumerate(checked):
            if key is None or key not in first:
                unique.append(index)
                if key is not None:
                    first[key] = index
        ids: list[UUID | None] = [None] * len(checked)
        done = 0
        for start in range(0, len(unique), batch):
            chunk = unique[start : start + batch]
            runs = [self._new_queued(*checked[i]) for i in chunk]
            stored: list[UUID] | None = None
            try:
                stored = self.store.create_many(
                    [(run, checked[i][1]) for i, (run, _) in zip(chunk, runs, strict=True)]
                )
            finally:
                for n, (run, probe) in enumerate(runs):
                    probe.ended(duplicate=stored is not None and stored[n] != run.id)
            for i, run_id in zip(chunk, stored, strict=True):
                ids[i] = run_id
            done += len(chunk)
            self.log.info(
                "runs_enqueued",
                count=len(chunk),
                duplicates=sum(1 for (run, _), s in zip(runs, stored, strict=True) if s != run.id),
            )
            if progress is not None:
                progress(done, len(unique))
        result: list[UUID] = []
        for index, (_, _, key, _, _) in enumerate(checked):
            found = ids[index] if key is None else ids[first[key]]
            assert found is not None, "every item's run was written or found"
            result.append(found)
        return result

    def _checked_items(
        self, items: Iterable[Mapping[str, Any]], actor: str
    ) -> list[tuple[str, bytes, str | None, str, Placed]]:
        checked = []
        for index, item in enumerate(items):
            try:
                checked.append(self._checked_item(item, actor))
            except (InvalidRequest, UnknownAgent, InvalidActor) as error:
                raise InvalidItem(index, str(error)) from error
        return checked

    def check_enqueue(self, item: Mapping[str, Any], *, actor: str = "enqueue") -> None:
        """Check one `enqueue_many` item as `enqueue_many` would, writing nothing.

        Raises:
            InvalidRequest, UnknownAgent, InvalidActor: what is wrong with it.
        """
        self._checked_item(item, actor)

    def _checked(
        self, agent: str, request: Mapping[str, Any] | None, key: str | None, actor: str
    ) -> bytes:
        """The request's stored body, once the agent, request, key and actor are checked."""
        return checked_enqueue(self.app, self.settings, agent, request, key=key, actor=actor)

    def _checked_item(
        self, item: Mapping[str, Any], actor: str
    ) -> tuple[str, bytes, str | None, str, Placed]:
        if not isinstance(item, Mapping):
            raise InvalidRequest("an item must be an object with an agent and a request")
        unknown = sorted(str(k) for k in item if k not in ITEM_FIELDS)
        if unknown:
            raise InvalidRequest(
                f"unknown field {unknown[0][:80]!r} (an item has {', '.join(ITEM_FIELDS)})"
            )
        agent = item.get("agent")
        if not isinstance(agent, str):
            raise InvalidRequest("an item needs an agent (a string)")
        key = item.get("idempotency_key")
        if key is not None and not isinstance(key, str):
            raise InvalidRequest("an idempotency key must be a string")
        who = item.get("actor", actor)
        if not isinstance(who, str):
            raise InvalidRequest("an actor must be a string")
        body = self._checked(agent, item.get("request"), key, who)
        placed = placement(
            self.app, agent, item.get("queue"), item.get("priority"), item.get("concurrency_key")
        )
        return agent, body, key, who, placed

    def _new_queued(
        self,
        agent: str,
        body: bytes,
        key: str | None,
        actor: str,
        placed: Placed = ("default", 0, None, None),
    ) -> tuple[Run, CreationProbe]:
        """A new queued run for a checked request body, with its telemetry probe."""
        run_id = new_run_id()
        probe = self.telemetry.run_created(agent=agent, run_id=run_id, how="enqueue")
        run = Run.enqueue(
            run_id=run_id,
            agent=agent,
            request_digest=digest(json.loads(body)),
            actor=actor,
            idempotency_key=key,
            trace_parent=probe.trace_parent,
            queue=placed[0],
            priority=placed[1],
            concurrency_key=placed[2],
            concurrency_limit=placed[3],
        )
        return run, probe

    def _request_body(self, agent: str, request: Mapping[str, Any] | None) -> bytes:
        return request_body(self.app, self.settings, agent, request)


def combined_app(app: App | None) -> App:
    """`app`'s agents with the built-in ones (`scripted`...), as a runtime serves them."""
    from steptrail.examples import app as examples

    combined = App()
    combined.include(examples)
    if app is not None:
        combined.include(app)
    return combined


def checked_enqueue(
    app: App,
    settings: Settings,
    agent: str,
    request: Mapping[str, Any] | None,
    *,
    key: str | None,
    actor: str,
) -> bytes:
    """The stored body of a request to enqueue, once the agent, request, idempotency key and
    actor are checked: what `Runtime.enqueue` checks, needing no database (the command line
    checks before it opens one, so bad input creates nothing, not even a schema).

    Raises:
        UnknownAgent: no agent of that name in `app`.
        InvalidRequest: the request, or the key, is not acceptable.
        InvalidActor: `actor` is not an acceptable actor name.
    """
    body = request_body(app, settings, agent, request)
    if key is not None and (not isinstance(key, str) or not key.strip()):
        raise InvalidRequest("an idempotency key cannot be blank")
    if key is not None and len(key) > MAX_KEY_LENGTH:
        raise InvalidRequest(f"an idempotency key has at most {MAX_KEY_LENGTH} characters")
    check_actor(actor)
    return body


def placement(
    app: App, agent: str, queue: Any, priority: Any, concurrency_key: Any = None
) -> Placed:
    """A new run's (queue, priority, concurrency key, limit): those given, else the agent's
    (ADR 0077, 0078).

    Raises:
        UnknownAgent: no agent of that name in `app`.
        InvalidRequest: a malformed or unknown queue, a priority out of range, a malformed
            concurrency key or one no limit applies to, an agent's run-level rate limit
            the App does not define.
    """
    try:
        placed = (*app.placement(agent, queue, priority), *app.keying(agent, concurrency_key))
        app.check_run_limit(agent)  # its run-level rate limit is defined (ADR 0083)
    except (ValueError, UnknownRateLimit) as error:
        raise InvalidRequest(str(error)) from None
    return placed


def request_body(
    app: App, settings: Settings, agent: str, request: Mapping[str, Any] | None
) -> bytes:
    """The canonical JSON a request is stored as, once checked against the agent's model
    and the size and depth limits (`workers.requests.encode_request`)."""
    return encode_request(app, agent, request, max_bytes=settings.max_request_bytes)


def trace_fields(run: Run) -> dict[str, str]:
    trace_id = run.state.trace_id
    return {"trace_id": trace_id} if trace_id is not None else {}
