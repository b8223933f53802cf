"""What every framework integration shares: the refusal outside a steptrail run, and a
framework's pending tool calls turned into a steptrail approval bound to their digest.

Kept free of any framework import, so each integration module imports only its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from steptrail.domain.decisions import DENIED
from steptrail.workers.context import RunContext, jsonable

__all__ = ["DENIED", "NotInSteptrailRun", "pending_call", "refusal", "require_sync_context"]


class NotInSteptrailRun(RuntimeError):
    """A steptrail-durable agent of another framework was run outside a steptrail run."""


def refusal(what: str, where: str) -> str:
    """The message of a `NotInSteptrailRun`: what refused, and where it must run instead."""
    return (
        f"{what} is durable with steptrail and runs only inside {where}; it refuses to run "
        "without durability"
    )


def pending_call(name: str, arguments: Mapping[str, Any], call_id: str) -> dict[str, Any]:
    """One pending call of an approval, as `RunContext.request_approval` takes it: the
    decision is bound to the SHA-256 digest of exactly these names, arguments and ids."""
    return {"name": name, "arguments": jsonable(dict(arguments)), "id": call_id}


def require_sync_context(ctx: object, what: str) -> RunContext:
    """`ctx` if it is a synchronous steptrail run context, else `NotInSteptrailRun`."""
    if not isinstance(ctx, RunContext):
        raise NotInSteptrailRun(refusal(what, "a synchronous steptrail agent"))
    return ctx
