"""The idle worker's wait rule (ADR 0082): its poll interval, or less when a run it may
claim comes due sooner; never a spin, never longer than the poll."""

from __future__ import annotations

import pytest

from steptrail.domain.idle import DUE_MARGIN_S, MIN_WAIT_S, idle_wait


def test_idle_wait__nothing_due_waits_the_poll() -> None:
    """No claimable run has a due time: the poll interval."""
    assert idle_wait(30.0, None) == 30.0


def test_idle_wait__a_sooner_due_time_shortens_the_wait() -> None:
    """A run due in 1 s under a 30 s poll: the worker waits 1 s and the margin."""
    assert idle_wait(30.0, 1.0) == pytest.approx(1.0 + DUE_MARGIN_S)


def test_idle_wait__a_later_due_time_keeps_the_poll() -> None:
    """A run due after the poll would fire: the poll interval (new work may come first)."""
    assert idle_wait(1.0, 3600.0) == 1.0


@pytest.mark.parametrize("due_in", [0.0, -0.2, -86_400.0])
def test_idle_wait__a_passed_due_time_claims_again_almost_at_once(due_in: float) -> None:
    """A run already due (came due after the claim's clock, or held by a peer's claim for
    a moment): the floor, not zero, so a worker does not spin."""
    assert idle_wait(1.0, due_in) == MIN_WAIT_S


def test_idle_wait__the_floor_never_exceeds_a_tiny_poll() -> None:
    """A poll shorter than the floor still bounds the wait."""
    assert idle_wait(0.001, -1.0) == 0.001
