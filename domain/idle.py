"""How long an idle worker waits before it claims again (ADR 0082): pure, no clock.

An idle worker (its last claim found nothing) is woken by the store when work is queued
(LISTEN/NOTIFY on PostgreSQL, in-process on SQLite) and otherwise claims again after its
poll interval. Nothing notifies when a sleeper's timer or a wait's deadline comes due: the
time is a column (`available_at`), not a write. So the worker asks the store how far away
the earliest such time is among the runs it may claim, and waits no longer than that.
"""

from __future__ import annotations

# A due time at or before now (a run that came due between the claim's clock reading and
# the store's answer, or one a peer's claim holds locked for the moment) is claimed again
# almost at once; the floor keeps a worker from spinning while a peer's claim commits.
MIN_WAIT_S = 0.005
# After a claim that took fewer runs than it asked for, the dispatcher waits this long (or
# until the store wakes it) before it claims again (ADR 0089). That claim saw every run due at
# its start; a claim at once would find only what came due in the instant since, while runs
# queued meanwhile wake the worker anyway. Without the pause a worker whose backlog is gone
# claims once per run as timers come due one by one (a claim each, mostly of one run, with
# an empty one between), instead of once per handful.
PARTIAL_CLAIM_WAIT_S = 0.005
# Added to the wait for a due time: the store's clock is read at its statement's start and
# the host's timer may fire a hair early, so the claim that follows finds the run due.
DUE_MARGIN_S = 0.001


def idle_wait(poll_interval: float, due_in_s: float | None) -> float:
    """Seconds an idle worker waits: its poll interval, or less when a run it may claim is
    due sooner (`due_in_s`, by the store's clock; None when no run has a due time).

    Args:
        poll_interval: the worker's poll interval (seconds, positive).
        due_in_s: seconds from the store's now to the earliest due time, negative when it
            has passed; None: nothing claimable has one.

    Returns:
        The wait, at least MIN_WAIT_S and at most `poll_interval`.
    """
    if due_in_s is None:
        return poll_interval
    return min(poll_interval, max(due_in_s + DUE_MARGIN_S, MIN_WAIT_S))
