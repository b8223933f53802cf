"""A request's checks and stored form, and a new run's id: shared by the runtime's enqueue
and a run that starts a child run (ADR 0075), moved here from `steptrail/runtime_enqueue.py`
(which re-exports them) so that the worker side needs nothing above its layer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from pydantic import ValidationError

from steptrail.domain.digest import canonical_json
from steptrail.domain.ids import ENTROPY_BYTES, time_ordered_id
from steptrail.domain.limits import PayloadRejected, check_depth, check_size
from steptrail.workers.registry import App


class InvalidRequest(ValueError):
    """A request cannot be enqueued as given (not JSON, or not what the agent accepts)."""


def problems(error: ValidationError, whole: str) -> str:
    """A validation error's problems on one line: `field: message; ...` (`whole` names the
    value itself when the problem is not in one of its fields)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or whole}: {e['msg']}" for e in error.errors()
    )


def new_run_id() -> UUID:
    """A new run's id: a UUID that sorts by the millisecond it was made (version 7), so the
    rows of runs made together share pages and a purge of the oldest runs walks one end of
    every table keyed by run (ADR 0052)."""
    return time_ordered_id(time.time_ns() // 1_000_000, os.urandom(ENTROPY_BYTES))


def encode_request(
    app: App, agent: str, request: Mapping[str, Any] | None, *, max_bytes: int
) -> bytes:
    """The canonical JSON a request is stored as, once checked against the agent's model
    and the size and depth limits.

    Raises:
        UnknownAgent: no agent of that name in `app`.
        InvalidRequest: what is wrong with the request.
    """
    spec = app.get(agent)
    value: Any = {} if request is None else request
    if not isinstance(value, Mapping):
        raise InvalidRequest("a request must be a JSON object")
    try:
        check_depth(value, "the request")
    except PayloadRejected as error:
        raise InvalidRequest(str(error)) from error
    if spec.request_model is not None:
        try:
            value = spec.request_model.model_validate(value).model_dump(
                mode="json", by_alias=True, exclude_unset=True
            )
        except ValidationError as error:
            found = problems(error, "request")
            raise InvalidRequest(f"invalid request for {agent!r}: {found}") from error
    try:
        body = canonical_json(dict(value))
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidRequest(f"the request cannot be serialised as JSON: {error}") from error
    try:
        check_size(len(body), max_bytes, "the request")
    except PayloadRejected as error:
        raise InvalidRequest(f"{error} (STEPTRAIL_MAX_REQUEST_BYTES)") from error
    return body
