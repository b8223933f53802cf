"""Child runs, as steps of the parent (ADR 0075): `RunContext.start_child`, `wait_child`,
`wait_all` and `wait_any` delegate here.

* **Starting** a child is a step of kind `child` (its name the child's agent). Its live body
  enqueues the child with the idempotency key `child:<parent id>:<key or step position>`
  and its outcome is the child's id. A parent that crashed after the enqueue and before the
  step's record replays into the same key, and the store hands back the child it created:
  a child is created once. The child is queued on the parent's queue at its priority, and
  keeps the parent's privacy level when that is stricter than its own agent's.
* **Waiting** for children is a step of kind `child_wait`. A settled child has sent its
  parent the signal `steptrail.child:<child id>` (in its settling transaction, see
  `infrastructure/children_store.py`); the wait takes it from the inbox at once, or
  suspends (no lease, no slot) on those names, the inbox read under the run's row lock as
  for any signal wait (ADR 0073), so a child that settles meanwhile is never missed. The
  step's journal entry keeps the child's outcome, so a replay neither waits nor reads again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from steptrail.domain.children import (
    CHILD_STEP,
    CHILD_WAIT_STEP,
    PARENT_ACTOR,
    ChildFailed,
    child_signal,
)
from steptrail.domain.digest import digest
from steptrail.domain.enums import PrivacyLevel, RunStatus, WaitKind
from steptrail.domain.errors import VersionConflict
from steptrail.domain.journal import StepCall, fingerprint
from steptrail.domain.ports import RunStore
from steptrail.domain.rate_limits import UnknownRateLimit
from steptrail.domain.run import Run
from steptrail.domain.waits import Signal, SignalArrived, SignalGuard, woken_at
from steptrail.workers import waits
from steptrail.workers.context_parts import Replayed
from steptrail.workers.registry import App
from steptrail.workers.requests import InvalidRequest, encode_request, new_run_id

if TYPE_CHECKING:
    from steptrail.workers.context import RunContext

# Attempts at cancelling a child that keeps moving under the cancel (as Runtime.cancel).
CANCEL_ATTEMPTS = 20

# A child's key among its siblings: as an idempotency key's, but shorter (it is a part of one).
MAX_CHILD_KEY = 200

# Privacy levels from the most to the least private: a child keeps the stricter of its
# agent's level and its parent's.
_STRICTNESS = (PrivacyLevel.NONE, PrivacyLevel.METADATA, PrivacyLevel.REDACTED, PrivacyLevel.FULL)


def stricter(a: PrivacyLevel, b: PrivacyLevel | None) -> PrivacyLevel:
    """The more private of two levels (`a` when `b` is None)."""
    if b is None:
        return a
    return a if _STRICTNESS.index(a) <= _STRICTNESS.index(b) else b


@dataclass(frozen=True)
class ChildHandle:
    """A child run this run started: pass it to `wait_child`, `wait_all` or `wait_any`."""

    run_id: UUID
    agent: str
    parent_id: UUID

    @property
    def signal(self) -> str:
        """The name of the signal the child sends this run when it settles."""
        return child_signal(self.run_id)


@dataclass(frozen=True)
class Spawner:
    """What a worker's context needs to start child runs: the app's agents and the request
    limit (the executor builds it; a context without one cannot start children)."""

    app: App
    max_request_bytes: int

    def body(self, agent: str, request: Mapping[str, Any] | None) -> bytes:
        return encode_request(self.app, agent, request, max_bytes=self.max_request_bytes)

    def keying(self, agent: str, parent: Run) -> tuple[str | None, int | None]:
        """The child's (concurrency key, limit): its agent's own key if it has one (limited
        by the App's patterns, as for any run), else the parent's key and limit.

        Raises:
            ValueError: the agent's own key has no limit (as `enqueue` refuses it).
            UnknownRateLimit: the agent's run-level rate limit is not defined.
        """
        own = self.app.keying(agent)
        self.app.check_run_limit(agent)  # a child's run-level rate limit (ADR 0083)
        if own[0] is not None:
            return own
        return parent.state.concurrency_key, parent.state.concurrency_limit

    def spawn(
        self,
        store: RunStore,
        parent: Run,
        *,
        agent: str,
        body: bytes,
        key: str,
        seq: int,
        privacy: PrivacyLevel,
    ) -> UUID:
        """Enqueue the child (or find the one the key made before); returns its id. The
        child takes its parent's queue and priority, and its concurrency key and limit
        unless its own agent names a key (`keying`; ADR 0078)."""
        state = parent.state
        concurrency_key, concurrency_limit = self.keying(agent, parent)
        child = Run.enqueue(
            run_id=new_run_id(),
            agent=agent,
            request_digest=digest(json.loads(body)),
            actor=f"{PARENT_ACTOR}{state.run_id}",
            idempotency_key=key,
            trace_parent=state.trace_parent,
            queue=state.queue,
            priority=state.priority,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            parent=(state.run_id, seq, privacy),
        )
        child_id = store.create(child, request=body).id
        # A cancel of the parent that landed after this segment's last fenced write, and
        # whose cascade read the children before this one was stored, is seen here: the
        # child is cancelled as the cascade would have (ADR 0081).
        after = store.load(state.run_id)
        if after is not None and after.status.is_terminal:
            cancel_orphan(store, child_id, actor=f"{PARENT_ACTOR}{state.run_id}")
        return child_id


def cancel_orphan(store: RunStore, child_id: UUID, *, actor: str) -> None:
    """Cancel a child whose parent settled before it was stored (unless it settled)."""
    for _ in range(CANCEL_ATTEMPTS):
        run = store.load(child_id)
        if run is None or run.status.is_terminal:
            return
        run.cancel(actor=actor, note="its parent had settled when it was started")
        try:
            store.append(run)
        except VersionConflict:
            continue  # a worker moved it on: cancel the newer state
        return


def start_child(
    ctx: RunContext,
    agent: str,
    request: Mapping[str, Any] | None,
    key: str | None,
) -> ChildHandle:
    """`ctx.start_child`: enqueue a run of `agent` as this run's child, exactly once."""
    spawner = ctx._spawner
    if spawner is None:
        raise RuntimeError("start_child needs the context of a worker (or the testing kit)")
    if key is not None and (
        not isinstance(key, str) or not key.strip() or len(key) > MAX_CHILD_KEY or "\x00" in key
    ):
        raise InvalidRequest(f"a child's key is 1 to {MAX_CHILD_KEY} characters with no NUL")
    body = spawner.body(agent, request)  # UnknownAgent, InvalidRequest: nothing written
    try:
        spawner.keying(agent, ctx._segment.run)
    except (ValueError, UnknownRateLimit) as bad:
        raise InvalidRequest(str(bad)) from None
    args = {"agent": agent, "key": key, "request": digest(json.loads(body))}
    step = ctx.open_step(CHILD_STEP, agent, payload={"agent": agent, "key": key}, args=args)
    if isinstance(step, Replayed):
        return ChildHandle(UUID(step.value["child"]), agent, ctx.run_id)
    position = ctx._journal.position
    idempotency_key = f"child:{ctx.run_id}:{key if key is not None else position}"
    seq, segment = ctx.next_seq, ctx._segment

    def enqueue() -> dict[str, str]:
        child_id = spawner.spawn(
            segment.store,
            segment.run,
            agent=agent,
            body=body,
            key=idempotency_key,
            seq=seq,
            privacy=ctx.privacy,
        )
        return {"child": str(child_id)}

    value = ctx._run_live(step, enqueue)
    ctx.log.info("child_started", child=value["child"], child_agent=agent, seq=seq)
    return ChildHandle(UUID(value["child"]), agent, ctx.run_id)


def wait_child(ctx: RunContext, handle: ChildHandle, timeout: float | None) -> Any:
    """`ctx.wait_child`: the child's result once it settled; ChildFailed if it did not
    complete; WaitTimedOut if `timeout` seconds passed first."""
    return _outcome(_wait(ctx, _checked(ctx, [handle]), timeout, "child"))


def wait_all(ctx: RunContext, handles: Sequence[ChildHandle], timeout: float | None) -> list[Any]:
    """`ctx.wait_all`: the children's results in the handles' order, each waited for in
    turn (`timeout` bounds each of those waits); the first one that did not complete
    raises ChildFailed."""
    checked = _checked(ctx, handles, empty_ok=True)
    return [_outcome(_wait(ctx, [h], timeout, "child")) for h in checked]


def wait_any(
    ctx: RunContext, handles: Sequence[ChildHandle], timeout: float | None
) -> tuple[ChildHandle, Any]:
    """`ctx.wait_any`: the first of the children to settle (by arrival of its signal) and
    its result; ChildFailed if that one did not complete."""
    checked = _checked(ctx, handles, distinct=True)
    body = _wait(ctx, checked, timeout, "children")
    first = next(h for h in checked if str(h.run_id) == body.get("child"))
    return first, _outcome(body)


def _checked(
    ctx: RunContext,
    handles: Sequence[ChildHandle],
    *,
    empty_ok: bool = False,
    distinct: bool = False,
) -> list[ChildHandle]:
    if isinstance(handles, ChildHandle) or not isinstance(handles, Sequence):
        raise TypeError("wait for a list of the handles start_child returned")
    found = list(handles)
    if not found and not empty_ok:
        raise ValueError("a wait for children needs at least one child's handle")
    for handle in found:
        if not isinstance(handle, ChildHandle):
            raise TypeError(f"not a child's handle (start_child returns one): {handle!r:.80}")
        if handle.parent_id != ctx.run_id:
            raise ValueError(f"run {handle.run_id} is not a child of this run")
    if distinct and len({h.run_id for h in found}) != len(found):
        raise ValueError("wait_any was given the same child twice")
    return found


def _outcome(body: dict[str, Any]) -> Any:
    if body.get("status") == RunStatus.COMPLETED.value:
        return body.get("result")
    raise ChildFailed.of(body)


def _wait(
    ctx: RunContext, handles: list[ChildHandle], timeout: float | None, what: str
) -> dict[str, Any]:
    """The settlement signal of the first of `handles` to settle, waited for as a step."""
    ms = waits.timeout_ms(timeout)
    names = [h.signal for h in handles]
    name = str(handles[0].run_id) if len(handles) == 1 else f"any of {len(handles)}"
    call = StepCall(CHILD_WAIT_STEP, name, fingerprint(names))
    entry = ctx._next(call)
    if entry is not None:
        if entry.value.get("timed_out"):
            raise waits.WaitTimedOut(what, timeout)
        return dict(entry.value["body"])
    seq = ctx.next_seq
    store = ctx._segment.store
    # A child sends its signal once: any of them in the inbox at all has settled.
    arrived = [s for s in (store.next_signal(ctx.run_id, n, 0) for n in names) if s is not None]
    if arrived:
        return _take(ctx, call, min(arrived, key=lambda s: s.seq))
    if woken_at(ctx._segment.run.state, WaitKind.EVENT, seq, names[0]):
        waits.record_outcome(ctx, call, {"timed_out": True}, {"timed_out": True})
        raise waits.WaitTimedOut(what, timeout)
    guard = SignalGuard(names[0], 0, names=tuple(names[1:]))
    try:
        waits.suspend_for(
            ctx,
            WaitKind.EVENT,
            seq=seq,
            name=names[0],
            ms=ms,
            guard=guard,
            names=tuple(names) if len(names) > 1 else (),
        )
    except SignalArrived as landed:  # it settled while this run was running: take it now
        return _take(ctx, call, landed.signal)


def _take(ctx: RunContext, call: StepCall, signal: Signal) -> dict[str, Any]:
    """Record the child's outcome as the wait's step: in the log its id and status only (the
    result stays out of the log, ADR 0008), in the journal all of it."""
    body: dict[str, Any] = json.loads(signal.payload)
    logged = {"signal": signal.seq, "child": body.get("child"), "status": body.get("status")}
    waits.record_outcome(ctx, call, logged, {"signal": signal.seq, "body": body})
    return body
