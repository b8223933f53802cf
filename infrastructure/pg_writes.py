"""The PostgreSQL store's writes and claims: a new run, the append of a run's pending events
as one call of `steptrail_append` (a settle's claim riding along, ADR 0058), and a batch
claim as one statement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from steptrail.domain.children import settles_child
from steptrail.domain.journal import JournalEntry
from steptrail.domain.ports import ClaimedRun, ClaimRequest
from steptrail.domain.queues import priority_changed
from steptrail.domain.run import Run
from steptrail.domain.waits import SignalGuard
from steptrail.infrastructure.codec import encode_event
from steptrail.infrastructure.pg_connections import (
    _NO_ENTRY,
    JOURNAL_COLUMNS,
    _claim_params,
    execute_kept,
)
from steptrail.infrastructure.pg_reads import PostgresReads
from steptrail.infrastructure.store_base import (
    encoded_events,
    journal_cut,
    journal_rows,
    keeps_request,
    side_effects,
    skip_unreadable,
    state_params,
)
from steptrail.projections.run_index import (
    claimable_after_ms,
    column_values,
    document_json,
)


class PostgresWrites(PostgresReads):
    """Writes and claims of `PostgresRunStore` (see the module docstring)."""

    def _params(self, run: Run) -> dict[str, Any]:
        params = state_params(run.state)
        params["doc"] = Jsonb(params["doc"])
        return params

    def create(self, run: Run, *, request: bytes | None) -> Run:
        (version, topic, state), *rest = encoded_events(run)
        assert version == 1, "a run is created at version 1"
        assert not rest, "a run is created by exactly one event"
        params = {**self._params(run), "topic": topic, "state": state, "request": request}
        with self._connection() as conn:
            row = conn.execute(self.q["insert_run"], params, prepare=True).fetchone()
        if row is not None and row["created"]:
            run.mark_committed()
            self.wake_here(run)
            return run
        if row is None:
            # The key was taken by a transaction that committed after the insert began, so
            # the row was not in its snapshot: read it now (the only second round trip).
            row = self._one("select_run_by_key", {"idempotency_key": run.state.idempotency_key})
            assert row is not None, "insert_run skipped but no run has the key"
        return self._run(row)

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
        if settles_child(run):  # its parent's signal in the same transaction (ADR 0075)
            keep = run.state.status.is_terminal and keeps_request(run.state)
            self.settle_child(run, resumable=resumable, keep_request=keep)
            return []
        name, params = self.append_statement(run, resumable=resumable)
        rows: list[DictRow] = []
        cut = journal_cut(run)
        with self._connection() as conn:
            if cut is not None:
                # `retry --from N` (rare): the append, then the entries from N on, in one
                # transaction; the function's fence raises first if another retry won.
                with conn.transaction():
                    conn.execute(self.q[name], params, prepare=True)
                    conn.execute(self.q["drop_journal_from"], {"run_id": run.id, "position": cut})
            elif priority_changed(run):
                # An operator's PriorityChanged (rare): steptrail_append writes no queue or
                # priority (nothing else changes them), so the new priority goes into the
                # row in the append's transaction, after its fence (ADR 0077).
                with conn.transaction():
                    conn.execute(self.q[name], params, prepare=True)
                    conn.execute(
                        self.q["set_priority"], {"run_id": run.id, "priority": run.state.priority}
                    )
            elif not (run.state.status.is_terminal and keeps_request(run.state)):
                if then_claim is None:
                    execute_kept(conn, self.q[name], params)
                else:
                    params.update(_claim_params(then_claim, prefix="c_"))
                    rows = execute_kept(conn, self.q[f"{name}_claim"], params).fetchall()
            else:
                # A failed settle (rare): the append with drop_saved off, then everything
                # saved but the request (and the journal, which it keeps too; ADR 0070),
                # in one transaction. Kept out of
                # steptrail_append so that its one-round-trip hot path stays as it is. It
                # claims nothing: the worker claims for the freed slot as usual.
                with conn.transaction():
                    conn.execute(self.q[name], params, prepare=True)
                    conn.execute(self.q["drop_saved_but_request"], {"run_id": run.id})
        run.mark_committed()
        if params["notify"]:  # as `wake_here`, from the side effects already worked out
            self._woken.set()
        return self._claimed(rows) if rows else []

    def append_statement(
        self, run: Run, *, resumable: bytes | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The query and its parameters for `run`'s pending events and journal: with one
        event or two (a settle carrying the last step) and at most one journal entry, the
        scalar `append_one` or `append_two`; else `append`, whose arrays psycopg adapts at a
        cost per list (ADR 0039, ADR 0053)."""
        pending = run.pending_events
        journal = journal_rows(run)
        if len(pending) > 2 or len(journal) > 1:
            return "append", self.append_params(run, resumable=resumable)
        params = self._append_common(run, resumable)
        params["topic"], params["state"] = encode_event(pending[0])
        if len(pending) == 2:
            params["topic_2"], params["state_2"] = encode_event(pending[1])
        entry = journal[0] if journal else _NO_ENTRY
        for column in JOURNAL_COLUMNS:
            params[f"j_{column}"] = entry[column]
        return ("append_one" if len(pending) == 1 else "append_two"), params

    def append_params(self, run: Run, *, resumable: bytes | None = None) -> dict[str, Any]:
        """The parameters of the `append` query for `run`'s pending events and journal."""
        events = encoded_events(run)
        journal = journal_rows(run)
        params = self._append_common(run, resumable)
        params["versions"] = [v for v, _, _ in events]
        params["topics"] = [t for _, t, _ in events]
        params["states"] = [s for _, _, s in events]
        for column in JOURNAL_COLUMNS:
            params[f"j_{column}s"] = [j[column] for j in journal]
        return params

    @staticmethod
    def _append_common(run: Run, resumable: bytes | None) -> dict[str, Any]:
        """What `append` and `append_one` share: the run's columns, its document as JSON
        text (one pydantic-core call; psycopg's Jsonb would run json.dumps over a dict
        model_dump built), the fence and the side effects."""
        state = run.state
        drop, notify = side_effects(state)
        keep = drop and keeps_request(state)  # see `append`
        params = column_values(state)
        params["doc"] = document_json(state)
        params["retry_delay_ms"] = claimable_after_ms(state)
        params["expected"] = run.committed_version
        params["resumable"] = resumable
        params["drop_saved"] = drop and not keep
        params["notify"] = notify
        return params

    def _claim(self, request: ClaimRequest) -> list[ClaimedRun]:
        """`claim_batch` (`store_base.Claims`): the `claim` statement, one round trip."""
        params = _claim_params(request, prefix="")
        with self._connection() as conn:
            if conn in self._claim_prepared:
                rows = execute_kept(conn, self.q["claim"], params).fetchall()
            else:
                # Outside a pipeline psycopg prepares on first use with a round trip of its
                # own (Parse, wait, then Bind/Execute); in one, Parse goes with the rest: the
                # claim is one round trip on a fresh connection too (ADR 0038). Only then:
                # a pipeline costs the client more CPU than a plain execute.
                with conn.pipeline():
                    rows = conn.execute(self.q["claim"], params, prepare=True).fetchall()
                self._claim_prepared.add(conn)
        return self._claimed(rows)

    def _claimed(self, rows: Sequence[DictRow]) -> list[ClaimedRun]:
        """The runs the `claim` query (or a settle's claim) returned, as the worker takes
        them, leaving out a run unreadable both ways (logged; its lease runs out and the
        reaper finds it, ADR 0066). updated_at is the claim's now(): the run's age is
        measured by the store's clock."""

        def claimed(row: DictRow) -> ClaimedRun:
            return ClaimedRun(
                run=self._run(row),
                request=bytes(row["request"] or b""),
                age_s=max(0.0, (row["updated_at"] - row["created_at"]).total_seconds()),
                journal=journal_from_arrays(row),
            )

        return skip_unreadable(claimed, rows)


def journal_from_arrays(row: Mapping[str, Any]) -> tuple[JournalEntry, ...] | None:
    """The journal a PostgreSQL claim returned with its run, as the parallel arrays of its
    `j_*` columns (ADR 0086): () for none, None when the query did not read it (a settle's
    claim), so the segment reads it itself."""
    if "j_seq" not in row:
        return None
    seqs = row["j_seq"]
    if seqs is None:
        return ()
    columns = zip(
        seqs,
        row["j_position"],
        row["j_kind"],
        row["j_name"],
        row["j_fingerprint"],
        row["j_outcome"],
        strict=True,
    )
    return tuple(
        JournalEntry.from_row(
            seq=int(seq),
            position=int(position),
            kind=kind,
            name=name,
            fingerprint=fingerprint,
            outcome=bytes(outcome),
        )
        for seq, position, kind, name, fingerprint, outcome in columns
    )
