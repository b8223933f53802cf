"""Human decisions: the pending calls a run waits on, their digest, and input validation.

The digest binds a decision to the exact calls a person saw: SHA-256 over the canonical JSON
of the pending calls. A decision that quotes another digest is refused, so approving a stale
screen can never approve different calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from steptrail.domain.digest import canonical_json, digest
from steptrail.domain.enums import WaitKind
from steptrail.domain.errors import InvalidInput
from steptrail.domain.limits import PayloadRejected, check_depth, check_size

DENIED = "denied by the operator"


class PendingCall(BaseModel):
    """A tool call the agent wants to make once a person approves it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ResumableState(BaseModel):
    """What a waiting run needs to pick up exactly where it paused, kept verbatim beside the
    log (never filtered by the privacy level) and deleted when the run settles."""

    model_config = ConfigDict(extra="forbid")

    kind: WaitKind
    calls: list[PendingCall] = Field(default_factory=list)
    conversation: Any = None
    input_schema: dict[str, Any] | None = None
    prompt: str | None = None
    values: dict[str, Any] | None = None


def calls_digest(calls: Sequence[PendingCall]) -> str:
    """The digest a decision on `calls` must quote."""
    return digest([c.model_dump(mode="json") for c in calls])


def state_digest(state: ResumableState) -> str:
    """The digest of what a waiting run waits on: its calls, or its input schema."""
    if state.kind is WaitKind.APPROVAL:
        return calls_digest(state.calls)
    return digest({"input_schema": state.input_schema, "prompt": state.prompt})


def check_input_bounds(values: Mapping[str, Any], max_bytes: int) -> None:
    """Refuse input too deep or too large to store, before anything else looks at it.

    Raises:
        InvalidInput: naming the limit.
    """
    try:
        check_depth(values, "the input")
        check_size(len(canonical_json(dict(values))), max_bytes, "the input")
    except PayloadRejected as error:
        raise InvalidInput(str(error)) from None
    except (TypeError, ValueError) as error:
        raise InvalidInput(f"the input is not JSON: {error}") from None
