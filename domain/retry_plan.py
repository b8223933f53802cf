"""What an operator's retry of a failed run does with its journal: a pure decision.

A failed run keeps its step journal until it is purged or retried (ADRs 0068 §4, 0070), so
its retry need not start over. `plan_retry` says, from the journal and the writes the log
shows as done, where the retried run starts running steps again and which recorded
non-idempotent writes that would repeat:

* **resume** (the default): the retried segment replays what the journal can answer
  (`journal.replayable`: positions 1..k, a trailing failure left out) and runs on from
  position k + 1, the step that failed. Every recorded step before it replays, writes
  included, so nothing needs `--force` unless a write's outcome is unknown (a pending
  marker without a result, which `Run.retry` checks).
* **from** N (`retry --from N`): the entries at positions N and later are dropped in the
  same fenced append as `Retried`, so steps 1..N-1 replay and N on run again. N must lie in
  1..k + 1 (past k + 1 nothing could replay up to it). A recorded non-idempotent write at
  or after N would run again: named, and refused unless forced.
* **restart**: the run recorded steps but its journal holds none (it failed before failed
  runs kept their journal), so the retry runs it from its request: every write the log
  shows as done would run again.

Which write would run again is judged by position: a done write whose entry still answers
its position (`journal.current`) runs again when that position does. A done write whose
entry is gone while the run has a journal was run again since (a `--from` or a re-run
step superseded it), and the write that superseded it is the one judged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from steptrail.domain.enums import Effect, RetryMode
from steptrail.domain.errors import IllegalTransition
from steptrail.domain.journal import JournalEntry, current, replayable
from steptrail.domain.run import Run, RunEvent


@dataclass(frozen=True)
class RetryPlan:
    """Where a retried run runs steps again (`position`; the steps before it replay from the
    journal), how, and which recorded non-idempotent writes that repeats (`rerun_writes`:
    their tools, in step order)."""

    mode: RetryMode = RetryMode.RESUME
    position: int = 1
    rerun_writes: tuple[str, ...] = ()

    @property
    def drops_journal(self) -> bool:
        """The retry drops the journal entries at `position` and later (`from` only)."""
        return self.mode is RetryMode.FROM


class InvalidRetryPosition(IllegalTransition):
    """`retry --from N` names a position the journal cannot replay up to; nothing written."""


def plan_retry(
    journal: Iterable[JournalEntry],
    writes_done: Iterable[tuple[int, str]],
    *,
    steps: int,
    from_position: int | None = None,
) -> RetryPlan:
    """The plan of a retry of a failed run (see the module docstring).

    Args:
        journal: the run's journal entries, as the store reads them.
        writes_done: (step seq, tool) of each non-idempotent write the log shows as done
            (`writes_done_at`).
        steps: how many steps the run recorded (its state's `steps`).
        from_position: run again from this step position (None: resume).

    Raises:
        InvalidRetryPosition: `from_position` is below 1 or past the replayable steps + 1.
    """
    entries = list(journal)
    done = list(writes_done)
    if steps > 0 and not entries:  # the journal went when the run settled: from the top
        mode = RetryMode.RESTART if from_position is None else RetryMode.FROM
        if from_position not in (None, 1):
            raise InvalidRetryPosition(
                f"cannot retry from step {from_position}: the run has no journal to replay "
                "(it failed before failed runs kept it), so a retry runs it from step 1"
            )
        return RetryPlan(mode, 1, tuple(tool for _, tool in done))
    recorded = len(replayable(entries))
    if from_position is None:
        mode, position = RetryMode.RESUME, recorded + 1
    else:
        if isinstance(from_position, bool) or not 1 <= from_position <= recorded + 1:
            held = f"steps 1..{recorded}" if recorded else "no step"
            raise InvalidRetryPosition(
                f"cannot retry from step {from_position}: the run's journal can replay "
                f"{held}, so a retry can run again from step 1 to {recorded + 1}"
            )
        mode, position = RetryMode.FROM, from_position
    tools = dict(done)
    rerun = tuple(
        tools[e.seq] for e in current(entries) if e.position >= position and e.seq in tools
    )
    return RetryPlan(mode, position, rerun)


def writes_done_at(events: Iterable[RunEvent]) -> tuple[tuple[int, str], ...]:
    """(step seq, tool) of each non-idempotent write a run's log shows as done: a marker,
    then that step's result recorded without an error. A retry that runs one of those steps
    again (by its journal entry's position, `retry_plan`) asks for force (ADRs 0025, 0070)."""
    started: dict[int, str] = {}
    done: list[tuple[int, str]] = []
    for event in events:
        if isinstance(event, Run.EffectPending) and event.effect is Effect.NON_IDEMPOTENT_WRITE:
            started[event.seq] = event.tool
        elif isinstance(event, Run.StepRecorded) and event.seq in started:
            tool = started.pop(event.seq)
            if event.error_type is None:
                done.append((event.seq, tool))
    return tuple(done)


def writes_done(events: Iterable[RunEvent]) -> tuple[str, ...]:
    """The tools of `writes_done_at`, in step order."""
    return tuple(tool for _, tool in writes_done_at(events))
