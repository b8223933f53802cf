"""The SQLite store's writes: a new run and the append of a run's pending events (encoded
before the write lock, only SQL inside it; ADR 0039), with what a settle drops."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from steptrail.domain.children import settles_child
from steptrail.domain.enums import RunStatus
from steptrail.domain.ports import ClaimedRun, ClaimRequest
from steptrail.domain.run import Run, RunState
from steptrail.domain.waits import SignalGuard
from steptrail.infrastructure.codec import encode_event
from steptrail.infrastructure.sqlite_claims import SQLiteClaims
from steptrail.infrastructure.sqlite_connections import (
    _hex,
    journal_cells,
)
from steptrail.infrastructure.store_base import (
    REQUEST,
    RESUMABLE,
    encoded_events,
    journal_cut,
    keeps_request,
    side_effects,
    state_params,
)
from steptrail.projections.run_index import (
    claimable_after_ms,
    column_values,
    document_json,
    document_only,
)


@dataclass(slots=True)
class _PreparedAppend:
    """An append encoded outside the write lock: what `_write_append` writes inside it."""

    run: Run
    run_hex: str
    state: RunState
    doc: str
    params: dict[str, Any] | None
    events: list[tuple[Any, ...]]
    resumable: bytes | None
    drop: bool
    wake: bool


class SQLiteWrites(SQLiteClaims):
    """Writes of `SQLiteRunStore` (see the module docstring)."""

    @staticmethod
    def _params(run: Run, at: int) -> dict[str, Any]:
        params = state_params(run.state)
        params["run_id"] = run.id.hex
        params["parent_id"] = _hex(run.state.parent_id)
        params["doc"] = document_json(run.state)
        params["at"] = at
        return params

    def _insert_events(self, cur: sqlite3.Cursor, run: Run, at: int) -> None:
        cur.executemany(self.q["insert_events"], self._event_params(run, at))

    @staticmethod
    def _event_params(run: Run, at: int) -> list[dict[str, Any]]:
        return [
            {"id": run.id.hex, "version": v, "topic": t, "state": s, "at": at}
            for v, t, s in encoded_events(run)
        ]

    def create(self, run: Run, *, request: bytes | None) -> Run:
        existing: sqlite3.Row | None = None
        with self._write() as (cur, at):
            if run.state.idempotency_key is not None:
                cur.execute(
                    self.q["select_run_by_key"], {"idempotency_key": run.state.idempotency_key}
                )
                existing = cur.fetchone()
            if existing is None:
                self._insert_events(cur, run, at)
                cur.execute(self.q["insert_run"], self._params(run, at))
                if request is not None:
                    params = {"run_id": run.id.hex, "kind": REQUEST, "body": request}
                    cur.execute(self.q["put_saved"], params)
        if existing is not None:
            # Decoded outside the write: a row read from the log instead (ADR 0066) reads
            # on a connection of its own.
            return self._run(existing)
        run.mark_committed()
        self.wake_here(run)
        return run

    def append(
        self,
        run: Run,
        *,
        resumable: bytes | None = None,
        then_claim: ClaimRequest | None = None,
        unless_signal: SignalGuard | None = None,
    ) -> list[ClaimedRun]:
        if not run.pending_events:
            return []
        if unless_signal is not None:
            self.append_guarded(run, unless_signal, resumable)
            return []
        # Everything is encoded before the write lock is taken; inside it only SQL runs, and
        # the statements that run with every step bind by position (ADR 0039).
        prepared = self._prepare_append(run, resumable)
        parent: Run | None = None
        with self._write() as (cur, at):
            self._write_append(cur, at, prepared)
            if settles_child(run):  # its parent's signal in the same write (ADR 0075)
                parent = self.tell_parent(cur, at, run)
            # A settle that claims the worker's next run in the same transaction (ADR 0058):
            # one write-lock turn instead of two. The settled run is claimable only if it
            # was requeued without a delay (available_at = at), as by any other claim.
            rows = self._claim_rows(cur, at, then_claim) if then_claim is not None else []
        run.mark_committed()
        if parent is not None:
            parent.mark_committed()
        if prepared.wake:
            self._woken.set()
        return self._claimed(rows, then_claim, at) if then_claim is not None and rows else []

    def append_in(self, cur: sqlite3.Cursor, at: int, run: Run, resumable: bytes | None) -> None:
        """`append`'s writes inside a write transaction the caller holds (a signal's delivery
        that wakes its run, a guarded suspension; ADR 0073). The caller marks `run`
        committed once its transaction committed."""
        prepared = self._prepare_append(run, resumable)
        self._write_append(cur, at, prepared)
        if prepared.wake:
            self._woken.set()  # early by a commit at most: a woken worker claims again later

    def _prepare_append(self, run: Run, resumable: bytes | None) -> _PreparedAppend:
        state = run.state
        run_hex = run.id.hex
        first = run.committed_version + 1
        pending = run.pending_events
        drop, wake = side_effects(state)
        lean = state.status is RunStatus.RUNNING and document_only(pending)
        doc = document_json(state)
        params: dict[str, Any] | None = None
        if not lean:
            params = column_values(state)
            params.update(run_id=run_hex, doc=doc, retry_delay_ms=claimable_after_ms(state))
        # A step's journal entry rides in its own StepRecorded's row (ADR 0050): an event
        # that lands brings its entry, one that does not, does not.
        cells = journal_cells(run)
        events = [
            (
                run_hex,
                first + i,
                *encode_event(e),
                cells.pop(e.seq, None) if cells and type(e) is Run.StepRecorded else None,
            )
            for i, e in enumerate(pending)
        ]
        if cells:
            raise RuntimeError(f"journal entries without their step's event: {sorted(cells)}")
        # Only a step already in the log can have left an entry: a run that settles with
        # its first steps (a one-step run, most of all) has none to drop.
        return _PreparedAppend(run, run_hex, state, doc, params, events, resumable, drop, wake)

    def _write_append(self, cur: sqlite3.Cursor, at: int, p: _PreparedAppend) -> None:
        if len(p.events) == 1:
            cur.execute(self.q["append_event"], (*p.events[0], at))
        else:
            cur.executemany(self.q["append_event"], [(*e, at) for e in p.events])
        if p.params is None:
            cur.execute(
                self.q["update_run_document"],
                (p.state.version, p.doc, at, p.state.lease_ms, at, p.run_hex),
            )
        else:
            p.params["at"] = at
            cur.execute(self.q["update_run"], p.params)
        if p.resumable is not None:
            cur.execute(
                self.q["put_saved"],
                {"run_id": p.run_hex, "kind": RESUMABLE, "body": p.resumable},
            )
        if p.drop:
            self._drop_on_settle(cur, p.run)
        cut = journal_cut(p.run)
        if cut is not None:
            cur.execute(self.q["drop_journal_from"], {"run_id": p.run_hex, "position": cut})

    def _drop_on_settle(self, cur: sqlite3.Cursor, run: Run) -> None:
        """Inside the settling append's transaction, after its inserts: drop the saved state
        and the journal, but a failed run's request, and its journal if it has a request
        to be retried with (`keeps_request`; ADRs 0025, 0070)."""
        state, run_hex = run.state, run.id.hex
        keep = keeps_request(state)
        cur.execute(self.q["drop_saved_but_request" if keep else "drop_saved"], {"run_id": run_hex})
        if keep:
            if state.steps:  # this append's own entries included: it runs after the inserts
                cur.execute(self.q["drop_journal_without_request"], {"run_id": run_hex})
        # Only a step already in the log can have left an entry: a run that settles with its
        # first steps (a one-step run, most of all) has none to drop.
        elif state.steps > sum(type(e) is Run.StepRecorded for e in run.pending_events):
            cur.execute(self.q["drop_journal"], {"run_id": run_hex})
