"""The step journal: each step's verbatim outcome, and the cursor that replays it.

A run's journal sits beside its log (ADR 0013). Every recorded step has one entry, written in
the same fenced append as the step's `StepRecorded`; the entry holds what the agent got back
(a JSON value, or an error's class and message), where the log holds only the privacy-filtered
record. A later segment of the run calls the agent function again and hands each step call
whose position already has an entry its recorded outcome instead of running it.

`JournalCursor` is that rule, pure and in one place, so that every kind of segment (sync or
async) replays the same way:

* **Positions.** The k-th step call of an execution is position k. Entries are read in step
  order (`seq`); an entry for a position at or before one already seen starts that position
  over (a step re-executed by a later segment), dropping what came after it.
* **Matching.** The call at position k must have the entry's kind, name and fingerprint of
  declared arguments; otherwise the agent's code (or its inputs) changed between segments, and
  handing back the recorded result would be wrong: `NonDeterministic`, never a result.
* **A failure that ended a segment is not replayed.** A trailing error entry is one the agent
  did not get past (it raised it out of the agent, which sent the run down the retry ladder),
  so the retry runs that step again. An error the agent caught and went on from has entries
  after it, and is replayed like a value.
* **Divergence is sticky.** After a mismatch every further call raises it again, so an agent
  that swallows the error cannot carry on with a history that is not its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from steptrail.domain.classifier import ClassifiedError
from steptrail.domain.digest import canonical_json
from steptrail.domain.enums import FailureClass

# Not canonical (nothing hashes an outcome): one plain encoder, built once, is what the hot
# path can afford; json.dumps with options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# What `value_json` wraps a value's own JSON text in: `{"value":` and `}`.
VALUE_WRAPPING = len('{"value":}')


def value_json(value: Any) -> str:
    """The stored JSON text of a step's value, `{"value": value}` (compact, not ASCII-only):
    ValueError if `value` has no JSON form (NaN, infinity). Its length less
    `VALUE_WRAPPING` is the length of the value's own JSON text."""
    # A scalar (a model's text, mostly) skips building the encoder for a dict: the same
    # text as encoding {"value": value}, at a tenth of the cost.
    if value is None or isinstance(value, (str, int, float)):
        return '{"value":%s}' % _ENCODER.encode(value)  # noqa: UP031 - the hot path's fastest
    return _ENCODER.encode({"value": value})


def fingerprint(arguments: Any) -> str:
    """A short digest of a step's declared arguments (JSON-compatible), for matching only."""
    return hashlib.sha256(canonical_json(arguments)).hexdigest()[:16]


@dataclass(frozen=True)
class StepCall:
    """What a step call is, for matching against the journal: kind, name, fingerprint."""

    kind: str
    name: str
    fingerprint: str

    def describe(self) -> str:
        return f"{self.kind} {self.name!r} (arguments {self.fingerprint})"


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One step's outcome, verbatim: a JSON value, or the error it raised.

    `seq` is the step's record number in the log; `position` is which step call of the
    agent's execution it answers (equal to `seq` unless a later segment re-ran a step).
    """

    seq: int
    position: int
    kind: str
    name: str
    fingerprint: str
    value: Any = None
    error_type: str | None = None
    error_message: str | None = None
    failure_class: FailureClass | None = None
    # The stored form, when whoever made the entry has encoded it already (not compared).
    encoded: bytes | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of_value(
        cls, position: int, call: StepCall, value: Any, *, seq: int = 0, text: str | None = None
    ) -> JournalEntry:
        """The entry of a step that returned `value`, encoded now: ValueError if `value` has
        no JSON form (NaN, infinity). `text`: `value_json(value)`, when the caller has made
        it already (the step record measures the value's size by it, ADR 0090)."""
        encoded = (value_json(value) if text is None else text).encode()
        return cls(seq, position, call.kind, call.name, call.fingerprint, value, encoded=encoded)

    @property
    def call(self) -> StepCall:
        return StepCall(self.kind, self.name, self.fingerprint)

    @property
    def failed(self) -> bool:
        return self.error_type is not None

    def outcome(self) -> bytes:
        """The verbatim outcome, as stored (JSON)."""
        if self.encoded is not None:
            return self.encoded
        if self.failed:
            body: dict[str, Any] = {
                "error": {
                    "type": self.error_type,
                    "message": self.error_message or "",
                    "class": self.failure_class.value if self.failure_class else None,
                }
            }
        else:
            body = {"value": self.value}
        return _ENCODER.encode(body).encode()

    @classmethod
    def from_row(
        cls, *, seq: int, position: int, kind: str, name: str, fingerprint: str, outcome: bytes
    ) -> JournalEntry:
        return cls.from_body(
            seq=seq,
            position=position,
            kind=kind,
            name=name,
            fingerprint=fingerprint,
            body=json.loads(outcome),
        )

    @classmethod
    def from_body(
        cls, *, seq: int, position: int, kind: str, name: str, fingerprint: str, body: Any
    ) -> JournalEntry:
        """The entry whose stored outcome, decoded, is `body`."""
        if not isinstance(body, dict):
            raise TypeError(f"journal entry of step {seq}: the outcome is not a JSON object")
        error = body.get("error")
        if error is None:
            return cls(seq, position, kind, name, fingerprint, value=body.get("value"))
        failure_class = FailureClass(error["class"]) if error.get("class") else None
        return cls(
            seq,
            position,
            kind,
            name,
            fingerprint,
            error_type=str(error.get("type")),
            error_message=str(error.get("message", "")),
            failure_class=failure_class,
        )


class ReplayedError(ClassifiedError):
    """A step's recorded error, raised again on replay in place of the original exception.

    It carries the original class name (`error_type`), message and failure class, so the
    retry ladder classifies it as it classified the original.
    """

    def __init__(self, entry: JournalEntry) -> None:
        super().__init__(
            entry.failure_class or FailureClass.UNKNOWN,
            f"{entry.error_type}: {entry.error_message}" if entry.error_message else "",
        )
        self.error_type = entry.error_type or "Exception"
        self.original_message = entry.error_message or ""


class NonDeterministic(ClassifiedError):
    """The agent asked for a different step than the journal recorded at that position."""

    def __init__(self, position: int, expected: StepCall, found: StepCall) -> None:
        super().__init__(
            FailureClass.NON_DETERMINISTIC,
            f"step {position}: the journal recorded {expected.describe()}, "
            f"the agent now calls {found.describe()}",
        )
        self.position = position
        self.expected = expected
        self.found = found


def current(entries: Iterable[JournalEntry]) -> list[JournalEntry]:
    """The entry that answers each position now, by position: read in step order, an entry
    for a position at or before one already seen starts that position over (a later segment
    ran it again), dropping what came after it."""
    by_position: dict[int, JournalEntry] = {}
    top = 0
    for entry in sorted(entries, key=lambda e: e.seq):
        if entry.position <= top:  # a later segment ran this position again
            for later in [p for p in by_position if p >= entry.position]:
                del by_position[later]
        by_position[entry.position] = entry
        top = entry.position
    return [by_position[p] for p in sorted(by_position)]


def replayable(entries: Iterable[JournalEntry], waited_at: int | None = None) -> list[JournalEntry]:
    """The entries a segment replays, positions 1..n: the contiguous prefix of `current`,
    without a trailing failure (the agent did not get past it: that step runs again) —
    unless the run was woken from a wait at a later step seq (`waited_at`): then the agent
    caught that failure and went on to the wait, and the failure replays as recorded. (Run
    again, the step would take a new seq, the wait's outcome would no longer be found at
    its seq, and the run would wait again, for ever.)"""
    prefix: list[JournalEntry] = []
    for expected, entry in enumerate(current(entries), start=1):
        if entry.position != expected:
            break
        prefix.append(entry)
    if prefix and prefix[-1].failed and (waited_at is None or waited_at <= prefix[-1].seq):
        prefix.pop()  # a failure that ended its segment: run that step again
    return prefix


class JournalCursor:
    """Hands back recorded outcomes by position (see the module docstring)."""

    def __init__(self, entries: Iterable[JournalEntry] = (), waited_at: int | None = None) -> None:
        self._entries = replayable(entries, waited_at)
        self.position = 0
        self.replayed = 0
        self.last_seq = 0
        self.diverged: NonDeterministic | None = None
        self._live = False
        self._opened = 0  # positions the segment took before the agent ran (ADR 0083)

    @property
    def recorded(self) -> int:
        """How many positions the journal can answer."""
        return len(self._entries)

    @property
    def untouched(self) -> bool:
        """No step call of the agent's has consulted the cursor yet."""
        return self.position == self._opened and not self._live

    @property
    def live(self) -> bool:
        """Replay is over: every further call runs for real."""
        return self._live or self.position >= len(self._entries)

    def upcoming(self) -> StepCall | None:
        """The call recorded at the next position (None once replay is over), without
        advancing: what a segment checks before the agent runs (ADR 0083)."""
        if self.diverged is not None or self.live:
            return None
        return self._entries[self.position].call

    def opened(self) -> None:
        """The positions consulted so far were the segment's own, before the agent ran (a
        run-level rate limit's step, ADR 0083): the agent's calls still find the cursor
        `untouched`, so it may resume by hand."""
        self._opened = self.position

    def go_live(self, position: int) -> None:
        """Stop replaying, numbering further calls on from `position` (the agent resumes by
        hand, through `ctx.resumed`, so its calls no longer line up with the journal)."""
        self._live = True
        self.position = position

    def next(self, call: StepCall) -> JournalEntry | None:
        """Advance to the next position: its recorded entry, or None when it must run.

        Raises:
            NonDeterministic: the recorded step at this position is a different one (also on
                every call after the first mismatch).
        """
        if self.diverged is not None:
            raise self.diverged
        if self.live:
            self.position += 1
            return None
        self.position += 1
        entry = self._entries[self.position - 1]
        if entry.call != call:
            self.diverged = NonDeterministic(self.position, entry.call, call)
            raise self.diverged
        self.replayed += 1
        self.last_seq = entry.seq
        return entry
