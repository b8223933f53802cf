"""Unit tests of the retry ladder and the reaper's verdict, over states built by `Run` commands."""

from __future__ import annotations

import math
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from steptrail.domain.digest import digest
from steptrail.domain.enums import Effect, FailureClass, TerminationReason, WaitKind
from steptrail.domain.retry import DeadLetter, Fail, Reclaim, Requeue, RetryPolicy
from steptrail.domain.run import Run, RunState

RUN_ID = UUID("00000000-0000-4000-8000-000000000002")
WORKER = "worker:host-a:101:5f0c"
LEASE = 900_000
CALLS = digest(["send_email"])
RETRYABLE = [c for c in FailureClass if c.is_retryable]
NOT_RETRYABLE = [c for c in FailureClass if not c.is_retryable]
POLICY = RetryPolicy()


def claimed(prior_requeues: int = 0) -> Run:
    """A worker-held run that was requeued `prior_requeues` times before this claim."""
    run = Run.enqueue(run_id=RUN_ID, agent="echo", request_digest=digest({}), actor="api")
    run.claim(holder=WORKER, lease_ms=LEASE)
    for _ in range(prior_requeues):
        run.requeue(delay_ms=0, failure_class=FailureClass.CONNECTION, error_type=None)
        run.claim(holder=WORKER, lease_ms=LEASE)
    return run


def with_pending(run: Run, effect: Effect) -> RunState:
    run.mark_effect_pending(tool="send_email", effect=effect)
    return run.state


def interactive() -> RunState:
    return Run.start(
        run_id=RUN_ID,
        agent="echo",
        request_digest=digest({}),
        holder="interactive:h:1:x",
        lease_ms=LEASE,
    ).state


def resumed() -> RunState:
    run = claimed()
    run.suspend(kind=WaitKind.APPROVAL, digest=CALLS)
    run.decide(by="operator", kind=WaitKind.APPROVAL, approved=True, digest=CALLS)
    run.resume(holder="resume:h:1:x", lease_ms=LEASE)
    return run.state


# -- on_failure ------------------------------------------------------------------------------------


@pytest.mark.parametrize("failure_class", NOT_RETRYABLE)
def test_on_failure__not_retryable_dead_letters(failure_class: FailureClass) -> None:
    """A non-retryable class dead-letters not_retryable, even with budget left."""
    decision = POLICY.on_failure(claimed().state, failure_class)
    assert decision == DeadLetter(TerminationReason.NOT_RETRYABLE, "failure_not_retryable")


def test_on_failure__not_retryable_before_pending_write_and_budget() -> None:
    """Not retryable is checked first: it wins over a pending write and a spent budget."""
    state = with_pending(claimed(prior_requeues=3), Effect.NON_IDEMPOTENT_WRITE)
    decision = POLICY.on_failure(state, FailureClass.AUTH)
    assert decision == DeadLetter(TerminationReason.NOT_RETRYABLE, "failure_not_retryable")


@pytest.mark.parametrize("failure_class", RETRYABLE)
def test_on_failure__pending_write_dead_letters(failure_class: FailureClass) -> None:
    """A retryable failure with a non-idempotent write pending dead-letters not_retryable."""
    state = with_pending(claimed(), Effect.NON_IDEMPOTENT_WRITE)
    decision = POLICY.on_failure(state, failure_class)
    assert decision == DeadLetter(TerminationReason.NOT_RETRYABLE, "non_idempotent_write_pending")


def test_on_failure__pending_write_before_budget() -> None:
    """A pending non-idempotent write wins over a spent budget."""
    state = with_pending(claimed(prior_requeues=3), Effect.NON_IDEMPOTENT_WRITE)
    decision = POLICY.on_failure(state, FailureClass.SERVER_ERROR)
    assert decision == DeadLetter(TerminationReason.NOT_RETRYABLE, "non_idempotent_write_pending")


def test_on_failure__pending_idempotent_write_still_retries() -> None:
    """An idempotent write may be repeated, so its pending marker does not stop a retry."""
    state = with_pending(claimed(), Effect.IDEMPOTENT_WRITE)
    assert POLICY.on_failure(state, FailureClass.CONNECTION) == Requeue(30_000)


def test_on_failure__cleared_write_retries() -> None:
    """Once the write recorded its result, the marker is gone and the run may retry."""
    run = claimed()
    run.mark_effect_pending(tool="send_email", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="send_email", duration_ms=1)
    assert POLICY.on_failure(run.state, FailureClass.CONNECTION) == Requeue(30_000)


def test_on_failure__errored_write_keeps_blocking_retry() -> None:
    """A write whose step errored may have happened, so the run is not retried."""
    run = claimed()
    run.mark_effect_pending(tool="send_email", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="send_email", duration_ms=1, error_type="TimeoutError")
    decision = POLICY.on_failure(run.state, FailureClass.CONNECTION)
    assert decision == DeadLetter(TerminationReason.NOT_RETRYABLE, "non_idempotent_write_pending")


@pytest.mark.parametrize("failure_class", RETRYABLE)
def test_on_failure__budget_spent_retries_exhausted(failure_class: FailureClass) -> None:
    """After max_requeues requeues, a retryable failure dead-letters retries_exhausted."""
    decision = POLICY.on_failure(claimed(prior_requeues=3).state, failure_class)
    assert decision == DeadLetter(TerminationReason.RETRIES_EXHAUSTED, "requeue_budget_spent")


@pytest.mark.parametrize(("prior", "delay"), [(0, 30_000), (1, 60_000), (2, 120_000)])
def test_on_failure__requeue_with_backoff(prior: int, delay: int) -> None:
    """With budget left, a retryable failure requeues after min(30 s · 2^prior, 600 s)."""
    assert POLICY.on_failure(claimed(prior).state, FailureClass.RATE_LIMIT) == Requeue(delay)


def test_on_failure__at_most_four_executions() -> None:
    """Following the ladder, a run that always fails runs four times and then dead-letters."""
    run = claimed()
    executions = 1
    while isinstance(decision := POLICY.on_failure(run.state, FailureClass.SERVER_ERROR), Requeue):
        run.requeue(
            delay_ms=decision.delay_ms, failure_class=FailureClass.SERVER_ERROR, error_type=None
        )
        run.claim(holder=WORKER, lease_ms=LEASE)
        executions += 1
    assert executions == 4
    assert decision == DeadLetter(TerminationReason.RETRIES_EXHAUSTED, "requeue_budget_spent")


def test_on_failure__budget_shared_with_reclaims() -> None:
    """Reclaims spend the same budget as failure retries."""
    run = claimed()
    for _ in range(3):
        run.reclaim(actor="reaper")
        run.claim(holder=WORKER, lease_ms=LEASE)
    decision = POLICY.on_failure(run.state, FailureClass.CONNECTION)
    assert decision == DeadLetter(TerminationReason.RETRIES_EXHAUSTED, "requeue_budget_spent")


@pytest.mark.parametrize("failure_class", list(FailureClass))
def test_on_failure__interactive_fails_provider_failed(failure_class: FailureClass) -> None:
    """An interactive segment is never requeued nor dead-lettered: it fails provider_failed."""
    assert POLICY.on_failure(interactive(), failure_class) == Fail(
        TerminationReason.PROVIDER_FAILED
    )


def test_on_failure__resumed_segment_fails_provider_failed() -> None:
    """A resumed segment surfaces its failure as provider_failed, without a retry."""
    assert POLICY.on_failure(resumed(), FailureClass.CONNECTION) == Fail(
        TerminationReason.PROVIDER_FAILED
    )


def test_on_failure__worker_without_saved_request_fails() -> None:
    """A worker segment whose saved request is gone cannot be requeued, so it fails."""
    # No command sequence yields a held worker run without its request; evolve it by hand.
    state = claimed().state.evolve(has_saved_request=False)
    assert POLICY.on_failure(state, FailureClass.CONNECTION) == Fail(
        TerminationReason.PROVIDER_FAILED
    )


def test_on_failure__max_requeues_zero_never_requeues() -> None:
    """With no budget at all, the first retryable failure dead-letters retries_exhausted."""
    decision = RetryPolicy(max_requeues=0).on_failure(claimed().state, FailureClass.CONNECTION)
    assert decision == DeadLetter(TerminationReason.RETRIES_EXHAUSTED, "requeue_budget_spent")


def test_on_failure__jitter_draw_passed_through() -> None:
    """The caller's draw shortens the requeue delay by up to the jitter share."""
    policy = RetryPolicy(jitter=0.5)
    assert policy.on_failure(claimed().state, FailureClass.CONNECTION, draw=0.5) == Requeue(22_500)


# -- on_stale --------------------------------------------------------------------------------------


def test_on_stale__reclaims_with_budget() -> None:
    """A stale worker run with its request and budget left is reclaimed."""
    assert POLICY.on_stale(claimed().state) == Reclaim()
    assert POLICY.on_stale(claimed(prior_requeues=2).state) == Reclaim()


def test_on_stale__pending_write_dead_letters() -> None:
    """A run abandoned during a non-idempotent write dead-letters not_retryable."""
    state = with_pending(claimed(), Effect.NON_IDEMPOTENT_WRITE)
    assert POLICY.on_stale(state) == DeadLetter(
        TerminationReason.NOT_RETRYABLE, "non_idempotent_write_pending"
    )


def test_on_stale__pending_write_before_missing_request() -> None:
    """A pending write is checked before the missing saved request."""
    run = Run.start(
        run_id=RUN_ID,
        agent="echo",
        request_digest=digest({}),
        holder="interactive:h:1:x",
        lease_ms=LEASE,
    )
    state = with_pending(run, Effect.NON_IDEMPOTENT_WRITE)
    assert POLICY.on_stale(state) == DeadLetter(
        TerminationReason.NOT_RETRYABLE, "non_idempotent_write_pending"
    )


def test_on_stale__pending_write_before_budget() -> None:
    """A pending write is checked before the budget."""
    state = with_pending(claimed(prior_requeues=3), Effect.NON_IDEMPOTENT_WRITE)
    assert POLICY.on_stale(state) == DeadLetter(
        TerminationReason.NOT_RETRYABLE, "non_idempotent_write_pending"
    )


def test_on_stale__no_saved_request_dead_letters() -> None:
    """An interactive run has no saved queued request, so it dead-letters not_retryable."""
    assert POLICY.on_stale(interactive()) == DeadLetter(
        TerminationReason.NOT_RETRYABLE, "no_saved_request"
    )


def test_on_stale__missing_request_before_budget() -> None:
    """The missing saved request is checked before the budget."""
    state = interactive().evolve(requeue_count=3)
    assert POLICY.on_stale(state) == DeadLetter(TerminationReason.NOT_RETRYABLE, "no_saved_request")


def test_on_stale__budget_spent_retries_exhausted() -> None:
    """A stale run that spent its budget dead-letters retries_exhausted."""
    assert POLICY.on_stale(claimed(prior_requeues=3).state) == DeadLetter(
        TerminationReason.RETRIES_EXHAUSTED, "requeue_budget_spent"
    )


def test_on_stale__idempotent_write_still_reclaims() -> None:
    """An idempotent write in flight may be repeated, so the run is reclaimed."""
    assert POLICY.on_stale(with_pending(claimed(), Effect.IDEMPOTENT_WRITE)) == Reclaim()


def test_on_stale__verdicts_are_commands_the_run_accepts() -> None:
    """The reaper's reclaim and dead-letter verdicts are both accepted by the stale run."""
    fresh, spent = claimed(), claimed(prior_requeues=3)
    assert POLICY.on_stale(fresh.state) == Reclaim()
    fresh.reclaim(actor="reaper")
    assert fresh.state.requeue_count == 1
    verdict = POLICY.on_stale(spent.state)
    assert isinstance(verdict, DeadLetter)
    spent.dead_letter(actor="reaper", reason=verdict.reason, cause=verdict.cause)
    assert spent.state.reason is TerminationReason.RETRIES_EXHAUSTED


# -- backoff ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prior", "expected"),
    [
        (0, 30_000),
        (1, 60_000),
        (2, 120_000),
        (3, 240_000),
        (4, 480_000),
        (5, 600_000),
        (6, 600_000),
    ],
)
def test_backoff__reference_delays(prior: int, expected: int) -> None:
    """The default delays are min(30 s · 2^prior, 600 s) in milliseconds."""
    assert POLICY.backoff_ms(prior) == expected


def test_backoff__negative_prior_is_base_and_huge_prior_is_cap() -> None:
    """A negative count means no prior retries; a huge one never exceeds the cap."""
    assert POLICY.backoff_ms(-3) == 30_000
    assert POLICY.backoff_ms(10_000) == 600_000


def test_backoff__no_jitter_ignores_draw() -> None:
    """With jitter 0 (the default), the draw changes nothing."""
    assert POLICY.backoff_ms(1, draw=0.99) == 60_000


def test_backoff__draw_clamped() -> None:
    """A draw outside [0, 1] is clamped, so the delay stays within its bounds."""
    policy = RetryPolicy(jitter=0.5)
    assert policy.backoff_ms(0, draw=-1.0) == 30_000
    assert policy.backoff_ms(0, draw=7.0) == 15_000


@given(
    prior=st.integers(min_value=-2, max_value=40),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    draw=st.floats(min_value=-1.0, max_value=2.0),
    base_ms=st.integers(min_value=0, max_value=100_000),
    cap_ms=st.integers(min_value=0, max_value=10_000_000),
)
def test_backoff__jitter_within_bounds(
    prior: int, jitter: float, draw: float, base_ms: int, cap_ms: int
) -> None:
    """A jittered delay never exceeds the exact delay nor the cap, nor drops below its share."""
    policy = RetryPolicy(base_ms=base_ms, cap_ms=cap_ms, jitter=jitter)
    exact = RetryPolicy(base_ms=base_ms, cap_ms=cap_ms).backoff_ms(prior)
    delay = policy.backoff_ms(prior, draw)
    assert delay <= exact <= cap_ms
    # Delays are whole milliseconds, so the lower bound is the floor of the exact share.
    assert delay >= math.floor(exact * (1.0 - jitter))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_requeues": -1},
        {"base_ms": -1},
        {"cap_ms": -1},
        {"jitter": -0.01},
        {"jitter": 1.01},
        {"jitter": float("nan")},
    ],
)
def test_policy__invalid_values_raise(kwargs: dict[str, float]) -> None:
    """A negative budget or delay, or a jitter outside [0, 1], raises ValueError."""
    with pytest.raises(ValueError, match=r"negative|jitter"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy__defaults_are_the_reference() -> None:
    """The defaults are the reference budget and delays, with no jitter."""
    assert RetryPolicy() == RetryPolicy(max_requeues=3, base_ms=30_000, cap_ms=600_000, jitter=0)
