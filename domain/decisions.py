"""Human decisions: the pending calls a run waits on, their digest, and input validation.

The digest binds a decision to the exact calls a person saw: SHA-256 over the canonical JSON
of the pending calls. A decision that quotes another digest is refused, so approving a stale
screen can never approve different calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict, Field

from steptrail.domain.digest import digest
from steptrail.domain.enums import WaitKind
from steptrail.domain.errors import InvalidInput

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


def validate_input(schema: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The declared keys of `values`, once they satisfy `schema` (a JSON Schema object).

    Raises:
        InvalidInput: the values do not satisfy the schema (nothing may change then).
    """
    try:
        jsonschema.validate(dict(values), dict(schema))
    except jsonschema.ValidationError as error:
        where = "/".join(str(p) for p in error.absolute_path) or "input"
        raise InvalidInput(f"{where}: {error.message}") from None
    except jsonschema.SchemaError as error:
        raise InvalidInput(f"the run declared an invalid schema: {error.message}") from None
    declared = schema.get("properties")
    if isinstance(declared, Mapping):
        return {k: v for k, v in values.items() if k in declared}
    return dict(values)
