"""Vocabularies of the run lifecycle: statuses, reasons, outcomes, effects, failure classes."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run is in its lifecycle; the last three are terminal."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    WAITING_FOR_INPUT = "waiting_for_input"
    WAITING_FOR_TIMER = "waiting_for_timer"
    WAITING_FOR_EVENT = "waiting_for_event"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def is_waiting(self) -> bool:
        return self in _WAITING

    @property
    def is_decidable(self) -> bool:
        """Waiting for a person (approval or input), as opposed to a timer or a signal."""
        return self in _DECIDABLE


_TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
_WAITING = frozenset(
    {
        RunStatus.WAITING_FOR_APPROVAL,
        RunStatus.WAITING_FOR_INPUT,
        RunStatus.WAITING_FOR_TIMER,
        RunStatus.WAITING_FOR_EVENT,
    }
)
# The waits a person ends (approve, deny, input); the others end by time or by a signal.
_DECIDABLE = frozenset({RunStatus.WAITING_FOR_APPROVAL, RunStatus.WAITING_FOR_INPUT})


class TerminationReason(StrEnum):
    """Why a run ended: a separate axis from status. Dead-letter is `failed` plus the last two."""

    COMPLETED = "completed"
    MAX_ITERATIONS = "max_iterations"
    BUDGET_EXHAUSTED = "budget_exhausted"
    POLICY_DENIED = "policy_denied"
    APPROVAL_DENIED = "approval_denied"
    PROVIDER_FAILED = "provider_failed"
    CANCELLED = "cancelled"
    RETRIES_EXHAUSTED = "retries_exhausted"
    NOT_RETRYABLE = "not_retryable"
    CONTEXT_TRUNCATED = "context_truncated"

    @property
    def is_retryable(self) -> bool:
        return self is TerminationReason.PROVIDER_FAILED

    @property
    def is_dead_letter(self) -> bool:
        return self in (TerminationReason.RETRIES_EXHAUSTED, TerminationReason.NOT_RETRYABLE)


class Outcome(StrEnum):
    """What a run segment returns to its caller; never stored. Callers must tolerate new members."""

    COMPLETED = "completed"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_INPUT = "awaiting_input"
    SLEEPING = "sleeping"
    AWAITING_EVENT = "awaiting_event"
    SUSPEND_FAILED = "suspend_failed"
    GUARDRAIL_BLOCKED = "guardrail_blocked"
    GUARDRAIL_APPROVAL_REQUIRED = "guardrail_approval_required"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"
    LEASE_LOST = "lease_lost"


class Segment(StrEnum):
    """Which kind of process holds a running run's lease."""

    WORKER = "worker"
    INTERACTIVE = "interactive"
    RESUME = "resume"


class Effect(StrEnum):
    """What running a tool does to the outside world."""

    READ_ONLY = "read_only"
    IDEMPOTENT_WRITE = "idempotent_write"
    NON_IDEMPOTENT_WRITE = "non_idempotent_write"

    @property
    def is_write(self) -> bool:
        return self is not Effect.READ_ONLY


class FailureClass(StrEnum):
    """Classes of failure; only connection, rate_limit, server_error, circuit_open and timeout
    (a step past its deadline) retry. `non_deterministic` (a replay found another step than
    the journal recorded) never does: running the code again would diverge again."""

    CONNECTION = "connection"
    RATE_LIMIT = "rate_limit"
    AUTH = "auth"
    CONFIGURATION = "configuration"
    CLIENT_ERROR = "client_error"
    SERVER_ERROR = "server_error"
    CIRCUIT_OPEN = "circuit_open"
    TIMEOUT = "timeout"
    NON_DETERMINISTIC = "non_deterministic"
    UNKNOWN = "unknown"

    @property
    def is_retryable(self) -> bool:
        return self in _RETRYABLE


_RETRYABLE = frozenset(
    {
        FailureClass.CONNECTION,
        FailureClass.RATE_LIMIT,
        FailureClass.SERVER_ERROR,
        FailureClass.CIRCUIT_OPEN,
        FailureClass.TIMEOUT,
    }
)


class WaitKind(StrEnum):
    """What a suspended run waits for."""

    APPROVAL = "approval"
    INPUT = "input"
    TIMER = "timer"
    EVENT = "event"


class RetryMode(StrEnum):
    """How an operator's retry runs a failed run again (ADR 0070): `resume` replays the
    journal and runs again from the step that failed; `from` replays the steps before a
    chosen position and runs the rest again; `restart` runs it from its request, its journal
    being gone (a run that failed before failed runs kept it; every retry recorded then)."""

    RESUME = "resume"
    FROM = "from"
    RESTART = "restart"


class PrivacyLevel(StrEnum):
    """How much of a step's content the per-step log keeps."""

    NONE = "none"
    METADATA = "metadata"
    REDACTED = "redacted"
    FULL = "full"

    @classmethod
    def parse(cls, value: object) -> PrivacyLevel:
        """An unset, unknown or invalid level means `metadata`, the safe default (note that
        an unset value is None, whose text "none" would otherwise name the `none` level)."""
        if type(value) is cls:  # the common case (every step's filter): nothing to parse
            return value
        if value is None:
            return cls.METADATA
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            return cls.METADATA
