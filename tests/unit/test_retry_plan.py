"""Unit tests of `plan_retry`: where a retried run runs again, and which writes repeat."""

from __future__ import annotations

import pytest

from steptrail.domain.enums import RetryMode
from steptrail.domain.journal import JournalEntry, StepCall
from steptrail.domain.retry_plan import InvalidRetryPosition, RetryPlan, plan_retry


def ok(seq: int, position: int, name: str) -> JournalEntry:
    return JournalEntry.of_value(position, StepCall("tool", name, "f" * 16), "v", seq=seq)


def bad(seq: int, position: int, name: str) -> JournalEntry:
    return JournalEntry(seq, position, "llm", name, "f" * 16, error_type="KeyError")


# llm at 1, an e-mail at 2, a bug at 3: the run.
MAILED = [ok(1, 1, "draft"), ok(2, 2, "send_email"), bad(3, 3, "summarise")]
SENT = [(2, "send_email")]


def test_plan__resume_runs_again_from_the_step_that_failed() -> None:
    """A plain retry replays steps 1..2 (the e-mail among them) and runs step 3 again:
    nothing repeats, so nothing needs force."""
    assert plan_retry(MAILED, SENT, steps=3) == RetryPlan(RetryMode.RESUME, 3, ())


def test_plan__resume_after_a_failure_between_steps_runs_on() -> None:
    """A run that failed after its last recorded step (outside any step) resumes after it."""
    assert plan_retry(MAILED[:2], SENT, steps=2) == RetryPlan(RetryMode.RESUME, 3, ())


@pytest.mark.parametrize(
    ("position", "rerun"), [(1, ("send_email",)), (2, ("send_email",)), (3, ())]
)
def test_plan__from_names_the_recorded_writes_at_or_after_it(
    position: int, rerun: tuple[str, ...]
) -> None:
    """From step N, the recorded non-idempotent writes at N or later would run again."""
    plan = plan_retry(MAILED, SENT, steps=3, from_position=position)
    assert plan == RetryPlan(RetryMode.FROM, position, rerun)
    assert plan.drops_journal


@pytest.mark.parametrize("position", [0, -1, 4, 99])
def test_plan__from_outside_the_journal_is_refused(position: int) -> None:
    """N must lie between 1 and the replayable steps + 1; the error says the range."""
    with pytest.raises(InvalidRetryPosition, match="from step 1 to 3"):
        plan_retry(MAILED, SENT, steps=3, from_position=position)


def test_plan__no_journal_means_a_restart_that_repeats_every_done_write() -> None:
    """A run that recorded steps but kept no journal (failed before it was kept) runs from
    its request: each write its log shows as done would repeat; only step 1 is a valid N."""
    assert plan_retry([], SENT, steps=3) == RetryPlan(RetryMode.RESTART, 1, ("send_email",))
    assert plan_retry([], SENT, steps=3, from_position=1).rerun_writes == ("send_email",)
    with pytest.raises(InvalidRetryPosition, match="no journal"):
        plan_retry([], SENT, steps=3, from_position=2)


def test_plan__a_run_that_recorded_nothing_resumes_at_step_one() -> None:
    """No steps and no journal: nothing to replay, nothing to repeat."""
    assert plan_retry([], [], steps=0) == RetryPlan(RetryMode.RESUME, 1, ())


def test_plan__a_write_run_again_since_is_judged_by_its_latest_execution() -> None:
    """After a forced `--from 2` the e-mail ran again at step 4 (position 2): its first
    execution's entry is gone, and only the current one counts, once."""
    journal = [ok(1, 1, "draft"), ok(4, 2, "send_email"), bad(5, 3, "summarise")]
    done = [(2, "send_email"), (4, "send_email")]
    assert plan_retry(journal, done, steps=5) == RetryPlan(RetryMode.RESUME, 3, ())
    assert plan_retry(journal, done, steps=5, from_position=2).rerun_writes == ("send_email",)


def test_plan__superseded_positions_do_not_count() -> None:
    """A position a later segment ran again (a re-run step) answers with its latest entry:
    the replayable prefix and the writes judged follow it."""
    journal = [ok(1, 1, "draft"), bad(2, 2, "send_email"), ok(3, 2, "send_email")]
    assert plan_retry(journal, [(3, "send_email")], steps=3) == RetryPlan(RetryMode.RESUME, 3, ())
