"""Delivering a signal to a run (ADR 0073): `rt.signal`, `steptrail signal`, the console.

A signal is checked completely before anything is written: the name, the sender, the
payload's depth and size (the request limits), the schema declared for the name with
`App.signal`, and that the run exists and has not settled. Then one transaction stores it in
the run's inbox and, if the run waits for that name, appends `Woken` at the run's version
(the fence): the run is queued now and a worker takes it. A run that does not wait for it
yet finds it there when it does, in the order signals arrived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

import structlog
from pydantic import BaseModel, ValidationError

from steptrail.domain.actors import check_actor
from steptrail.domain.children import refuse_reserved
from steptrail.domain.digest import canonical_json
from steptrail.domain.errors import IllegalTransition, InvalidInput, UnknownRun, VersionConflict
from steptrail.domain.limits import PayloadRejected, check_depth, check_size
from steptrail.domain.ports import RunStore
from steptrail.domain.run import Run
from steptrail.domain.waits import check_signal_name, waits_for, wake
from steptrail.workers.requests import problems

# A run whose holder keeps appending steps moves its version under the sender; each attempt
# reloads it. Steps are far slower than this loop, so a handful always suffices.
DELIVERY_ATTEMPTS = 20


@dataclass(frozen=True)
class SignalSent:
    """A delivered signal: its number in the run's inbox, and whether it woke the run."""

    run_id: UUID
    name: str
    seq: int
    woke: bool


class Signals:
    """Deliver signals to runs (see the module docstring)."""

    def __init__(
        self,
        store: RunStore,
        *,
        max_payload_bytes: int,
        schemas: dict[str, type[BaseModel]] | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.store = store
        self.max_payload_bytes = max_payload_bytes
        self.schemas = schemas or {}
        self.log = log or structlog.get_logger()

    def encode(self, name: str, payload: Any) -> bytes:
        """The payload as stored, once it passed every check (nothing is written here).

        Raises:
            ValueError: not a signal name. InvalidInput: the payload is too deep, too large,
                not JSON, or does not match the name's declared schema.
        """
        check_signal_name(name)
        refuse_reserved(name)  # child runs' signals are steptrail's own (ADR 0075)
        try:
            check_depth(payload, "the signal's payload")
        except PayloadRejected as error:
            raise InvalidInput(str(error)) from None
        model = self.schemas.get(name)
        if model is not None:
            try:
                payload = model.model_validate(payload).model_dump(mode="json")
            except ValidationError as error:
                found = problems(error, "payload")
                raise InvalidInput(f"invalid payload for signal {name!r}: {found}") from None
        try:
            body = canonical_json(payload)
        except (TypeError, ValueError, RecursionError) as error:
            raise InvalidInput(f"the signal's payload is not JSON: {error}") from None
        try:
            check_size(len(body), self.max_payload_bytes, "the signal's payload")
        except PayloadRejected as error:
            raise InvalidInput(f"{error} (STEPTRAIL_MAX_PAYLOAD_BYTES)") from None
        return body

    def send(self, run_id: UUID, name: str, payload: Any = None, *, by: str) -> SignalSent:
        """Deliver `payload` as the signal `name` to the run `run_id`.

        Raises:
            UnknownRun: no such run. IllegalTransition: the run has settled (nothing is
                written). InvalidActor, InvalidInput, ValueError: as `encode` and
                `check_actor`.
        """
        check_actor(by)
        body = self.encode(name, payload)
        for _ in range(DELIVERY_ATTEMPTS):
            run = self.store.load(run_id)
            if run is None:
                raise UnknownRun(f"no run {run_id}")
            if run.status.is_terminal:
                raise IllegalTransition(
                    f"run {run_id} is {run.status.value}; a signal to a settled run is refused"
                )
            woke = waits_for(run.state, name)

            def waking(seq: int, run: Run = run, woke: bool = woke) -> Run | None:
                if not woke:
                    return None
                wake(run, actor=by, name=name, signal_seq=seq)
                return run

            try:
                seq = self.store.deliver_signal(
                    run, name=name, payload=body, sent_by=by, wake=waking
                )
            except VersionConflict:
                continue  # the run moved on (a step, a claim, a settle): judge it again
            self.log.info(
                "signal_delivered", run_id=str(run_id), signal=name, seq=seq, woke=woke, by=by
            )
            return SignalSent(run_id=run_id, name=name, seq=seq, woke=woke)
        raise IllegalTransition(f"run {run_id} kept changing; the signal was not delivered")
