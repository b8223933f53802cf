"""Errors the domain raises. Each means nothing was recorded."""

from __future__ import annotations


class DomainError(Exception):
    """Base of every error raised by the domain."""


class IllegalTransition(DomainError):
    """A command is not allowed in the run's current state; no event was recorded."""


class DigestMismatch(DomainError):
    """A decision names pending calls other than the ones the run waits on."""


class InvalidInput(DomainError):
    """Submitted input does not match the schema the run declared."""


class VersionConflict(DomainError):
    """Somebody else appended to the run since the version this append was fenced on.

    For a lease holder this is how it learns it lost the run (reclaimed, cancelled, claimed by
    another segment); for the reaper it means a heartbeat landed first.
    """


class StoreUnavailable(DomainError):
    """The store could not be reached; whether the last write landed is unknown."""


class UnknownRun(DomainError):
    """No run has that id."""


class PendingWrite(IllegalTransition):
    """A retry would run again a non-idempotent write that may have happened; needs force."""


class UnreadableEvent(DomainError):
    """A stored event cannot be decoded; the message names its run and version.

    Readers report it and go on where they can (the projection runner retries later, `show`
    names the event); nothing is skipped silently.
    """


class UnreadableRun(DomainError):
    """A run's row in the run index cannot be decoded and neither can its log be replayed;
    the message names the run.

    An unreadable row alone is not an error: readers take the run from its log instead (the
    index is a projection of the log, ADR 0066). Workers and the reaper skip a run that is
    unreadable both ways and log it; `verify` reports it.
    """


class InvalidActor(DomainError):
    """A name given as who acted (`--by`) is not an acceptable actor name; nothing changed."""


class CorruptResumableState(DomainError):
    """The saved resumable state is unreadable or does not match what the run waits on."""


class InvalidRunId(DomainError, ValueError):
    """What was given for a run is not an id nor a part of one (ADR 0074); nothing changed."""


class AmbiguousRunId(InvalidRunId):
    """A part of an id matches several runs; the message lists some of them (ADR 0074)."""

    def __init__(self, reference: str, candidates: list[str]) -> None:
        listed = ", ".join(candidates)
        super().__init__(
            f"{reference!r} matches more than one run ({listed}); give more of its digits"
        )
        self.candidates = candidates
