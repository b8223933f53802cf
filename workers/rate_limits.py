"""A step's rate limit (ADR 0080): the grant before its live call, the wait, the correction.

`ctx.llm(..., limit="openai", tokens=estimate)`, `ctx.step(..., limit=...)` and `ctx.tool(...,
limit=...)` delegate here, and so does an agent's run-level limit (`workers/run_limits.py`).
The rules that make it safe:

* **Replay never acquires.** The grant is asked for only once the journal has said the step
  must run (`open_step` returned a `LiveStep`), after its boundary: a replayed step spent
  its grant in the segment that ran it. A write tool's pending-effect marker comes after
  the grant (ADR 0083): no run waits, in place or asleep, holding a marker.
* **The store decides.** Each attempt is one transaction of the store (`acquire_rate`),
  which judges the sliding window by its own clock under the limit's lock: workers on
  every machine share one window, and none trusts its own clock or memory.
* **A short wait is waited out in place, a long one holds nothing.** While the waits of a
  step add up to at most `PATIENCE_S` (2 s) the agent's thread (or task) sleeps and tries
  again; its lease keeper renews the lease meanwhile, and once granted the step proves the
  run is still its own (a fenced renewal) before it calls out: a run cancelled during the
  wait does not make the call. Past that, the run suspends on a timer
  named `rate_limit:<name>` (the durable sleep of ADR 0073: no lease, no slot) until the
  window allows; on waking, the agent replays to the same step and tries again. Neither
  wait is a failure: nothing is retried, nothing dead-letters.
* **Real usage corrects the estimate.** A step returning `Recorded(value, tokens=n)` with
  `n > 0` replaces its grant's estimated tokens by `n`, for every later decision.
* **A provider's 429 blocks the limit.** A step failing with an error classified
  `rate_limit` that says how long to wait (`retry_after`, or the `Retry-After` header of its
  `response`, in seconds or as an HTTP date) blocks the limit for every worker until then
  (at most an hour); the error then goes the way of any error (the run's retry policy).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, cast
from uuid import UUID

from steptrail.domain.enums import FailureClass, WaitKind
from steptrail.domain.errors import StoreUnavailable
from steptrail.domain.rate_limits import (
    STEP_NAME_PREFIX,
    InvalidRateLimit,
    RateAnswer,
    RateLimit,
    UnknownRateLimit,
    retry_after_of,
)
from steptrail.workers import waits

if TYPE_CHECKING:
    from collections.abc import Iterable

    from steptrail.workers.context import RunContext
    from steptrail.workers.context_parts import LiveStep, Recorded
    from steptrail.workers.store_threads import StoreThreads

# How long, in all, one step waits for its grant in place before the run suspends instead.
PATIENCE_S = 2.0


class RateLimitStore(Protocol):
    """What a store does for rate limits (both backends: infrastructure/rate_limits_store)."""

    def define_rate_limits(self, limits: Iterable[RateLimit], *, by: str) -> None: ...

    def acquire_rate(self, name: str, tokens: int, run_id: UUID) -> RateAnswer: ...

    def correct_rate_grant(self, grant_id: int, tokens: int) -> None: ...

    def block_rate_limit(self, name: str, seconds: float) -> None: ...


@dataclass
class RateClaim:
    """A live step's use of a limit: what it asks for, and its grant once given."""

    limit: RateLimit
    tokens: int
    grant_id: int | None = None
    waited_s: float = 0.0


def claim(limits: Mapping[str, RateLimit], name: str | None, tokens: Any) -> RateClaim | None:
    """The claim a step with `limit=name, tokens=tokens` makes (None without a limit),
    checked before anything runs or is written.

    Raises:
        InvalidRateLimit: `tokens=` without `limit=`, or tokens no grant could hold.
        UnknownRateLimit: the app defines no limit `name`.
    """
    if name is None:
        if tokens is not None:
            raise InvalidRateLimit("tokens= estimates a step's use of a rate limit: give limit=")
        return None
    limit = limits.get(name)
    if limit is None:
        known = ", ".join(sorted(limits)) or "none"
        raise UnknownRateLimit(
            f"no rate limit {name!r} is defined (App.rate_limit; defined: {known})"
        )
    return RateClaim(limit, limit.check_use(tokens))


def store_definitions(store: object, limits: Mapping[str, RateLimit], *, by: str = "code") -> None:
    """Store the app's limits as its code defines them (a worker does it when it starts), so
    every worker on every machine judges the same definition; a changed one is updated."""
    if limits:
        cast("RateLimitStore", store).define_rate_limits(limits.values(), by=by)


def _store(ctx: RunContext) -> RateLimitStore:
    return cast("RateLimitStore", ctx._segment.store)


def attempt(ctx: RunContext, rate: RateClaim) -> float:
    """One try for the grant: 0.0 once it is given, else the seconds to wait in place
    before the next try. A wait past the step's patience suspends the run instead.

    Raises:
        Suspend: the run now sleeps until the window allows (its lease released).
        LeaseLost: the run was lost or cancelled while suspending.
    """
    store, name = _store(ctx), rate.limit.name
    try:
        answer = store.acquire_rate(name, rate.tokens, ctx.run_id)
    except UnknownRateLimit:
        # No worker stored it yet (a process that runs segments itself, the testing kit):
        # store the code's definition, as a worker does when it starts.
        store.define_rate_limits([rate.limit], by="code")
        answer = store.acquire_rate(name, rate.tokens, ctx.run_id)
    if answer.grant_id is not None:
        rate.grant_id = answer.grant_id
        return 0.0
    if rate.waited_s + answer.wait_s <= PATIENCE_S:
        rate.waited_s += answer.wait_s
        return answer.wait_s
    ms = math.ceil(answer.wait_s * 1000) + 1
    ctx.log.info("rate_limit_waiting", limit=name, wait_ms=ms, seq=ctx.next_seq)
    return waits.suspend_for(  # raises Suspend: the run sleeps until the window allows
        ctx, WaitKind.TIMER, seq=ctx.next_seq, name=STEP_NAME_PREFIX + name, ms=ms, guard=None
    )


def acquire(
    ctx: RunContext, step: LiveStep, sleep: Callable[[float], None] = time.sleep
) -> LiveStep:
    """`step` once granted (its duration counted from then), waiting in place (on the
    agent's thread) or suspending."""
    rate = step.rate
    assert rate is not None
    try:
        while (wait := attempt(ctx, rate)) > 0:
            sleep(wait)
        return granted(ctx, step)
    except BaseException:
        step.probe.close()
        raise


async def acquire_async(ctx: RunContext, threads: StoreThreads, step: LiveStep) -> LiveStep:
    """`acquire` for an async agent: each try on a store thread, each wait awaited."""
    rate = step.rate
    assert rate is not None
    try:
        while (wait := await threads.call(attempt, ctx, rate)) > 0:
            await asyncio.sleep(wait)
        # Only a marker or a wait has a store call to make: else no hop to a store thread.
        calls_store = step.marker is not None or rate.waited_s > 0
        return await threads.call(granted, ctx, step) if calls_store else step
    except BaseException:
        step.probe.close()
        raise


def granted(ctx: RunContext, step: LiveStep) -> LiveStep:
    """`step` once its grant is given (on the thread that may call the store): a write
    tool's marker appended (ADR 0083), fenced, so it also proves the run is still ours
    after any wait; else, after a wait, a heartbeat for that proof (a cancel may have come
    meanwhile). Its duration counts from the grant."""
    rate = step.rate
    assert rate is not None
    if step.marker is not None:
        step = ctx.mark_pending(step)
    elif rate.waited_s:
        ctx.heartbeat()
    if rate.waited_s == 0:
        return step
    return replace(step, started=time.perf_counter())


def settle(
    ctx: RunContext, rate: RateClaim, extra: Recorded[Any] | None, error: BaseException | None
) -> None:
    """After the live call: correct the grant's tokens, or block the limit after a 429.

    Best effort: a store that cannot be reached leaves the estimate (or no block) and the
    step is recorded as it would be without a limit."""
    if rate.grant_id is None:
        return
    store, name = _store(ctx), rate.limit.name
    try:
        if error is not None:
            # An HTTP date is read by this worker's clock (the block itself is counted
            # on the store's): their skew errs into the block's length (ADR 0083).
            after = retry_after_of(error, now=datetime.now(UTC))
            if after is not None and ctx._classify(error) is FailureClass.RATE_LIMIT:
                store.block_rate_limit(name, after)
                ctx.log.warning("rate_limit_blocked", limit=name, retry_after_s=after)
        elif extra is not None and extra.tokens > 0 and extra.tokens != rate.tokens:
            store.correct_rate_grant(rate.grant_id, extra.tokens)
    except StoreUnavailable as unavailable:
        ctx.log.warning("rate_limit_not_updated", limit=name, error=type(unavailable).__name__)
