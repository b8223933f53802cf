"""The retry ladder and the reaper's verdict: pure decisions over a run's state.

Both share one budget, `max_requeues` (default 3, so at most 4 executions): a failure retry
and a stale-lease reclaim each spend one requeue, so a run that crashes its worker every time
still ends dead-lettered instead of looping (ADR 0006).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from steptrail.domain.enums import FailureClass, Segment, TerminationReason
from steptrail.domain.run import RunState


@dataclass(frozen=True)
class Requeue:
    """Send the run back to the queue, claimable after `delay_ms`."""

    delay_ms: int


@dataclass(frozen=True)
class Reclaim:
    """Put a stale run back on the queue at once."""


@dataclass(frozen=True)
class DeadLetter:
    """End the run `failed` with a dead-letter reason; `cause` says which rule fired."""

    reason: TerminationReason
    cause: str


@dataclass(frozen=True)
class Fail:
    """End the run `failed` without retry (interactive and resumed segments)."""

    reason: TerminationReason


RetryDecision = Requeue | DeadLetter | Fail
StaleDecision = Reclaim | DeadLetter


@dataclass(frozen=True)
class RetryPolicy:
    """How failed and stale runs are retried.

    Args:
        max_requeues: requeues allowed in a run's life, shared by retries and reclaims.
        base_ms: the first retry's delay; each further retry doubles it.
        cap_ms: no retry waits longer than this.
        jitter: a fraction in [0, 1]; the delay is reduced by up to this share of itself
            (drawn by the caller), so a burst of failures does not retry in lockstep. The
            cap is never exceeded. 0 (the default) means the exact reference delays.
    """

    max_requeues: int = 3
    base_ms: int = 30_000
    cap_ms: int = 600_000
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.max_requeues < 0 or self.base_ms < 0 or self.cap_ms < 0:
            raise ValueError("retry budget and delays cannot be negative")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter is a fraction between 0 and 1")

    def backoff_ms(self, prior_requeues: int, draw: float = 0.0) -> int:
        """`min(base · 2^prior, cap)`, less `jitter · draw` of itself (`draw` in [0, 1))."""
        exact: int = min(self.base_ms << max(0, prior_requeues), self.cap_ms)
        # Rounded up: never below (1 - jitter) · exact, never above exact.
        return math.ceil(exact * (1.0 - self.jitter * min(max(draw, 0.0), 1.0)))

    def on_failure(
        self, state: RunState, failure_class: FailureClass, draw: float = 0.0
    ) -> RetryDecision:
        """What to do with a running run whose agent raised an error of `failure_class`.

        The order is the contract: not retryable, then a pending non-idempotent write, then
        the budget, and only then a requeue.
        """
        if state.segment is not Segment.WORKER or not state.has_saved_request:
            return Fail(TerminationReason.PROVIDER_FAILED)
        if not failure_class.is_retryable:
            return DeadLetter(TerminationReason.NOT_RETRYABLE, "failure_not_retryable")
        if state.pending_non_idempotent_write:
            return DeadLetter(TerminationReason.NOT_RETRYABLE, "non_idempotent_write_pending")
        if state.requeue_count >= self.max_requeues:
            return DeadLetter(TerminationReason.RETRIES_EXHAUSTED, "requeue_budget_spent")
        return Requeue(self.backoff_ms(state.requeue_count, draw))

    def on_stale(self, state: RunState) -> StaleDecision:
        """What the reaper does with a running run whose lease expired."""
        if state.pending_non_idempotent_write:
            return DeadLetter(TerminationReason.NOT_RETRYABLE, "non_idempotent_write_pending")
        # An interactive or resumed segment ran in somebody's own process, not from the queue:
        # there is no queued request for a worker to run again.
        if not state.has_saved_request or state.segment is not Segment.WORKER:
            return DeadLetter(TerminationReason.NOT_RETRYABLE, "no_saved_request")
        if state.requeue_count >= self.max_requeues:
            return DeadLetter(TerminationReason.RETRIES_EXHAUSTED, "requeue_budget_spent")
        return Reclaim()
