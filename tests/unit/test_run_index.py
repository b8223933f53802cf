"""The run index's split of a state into columns and a document, as the append path uses it."""

from __future__ import annotations

import json
import uuid

from steptrail.domain.enums import Effect, FailureClass, WaitKind
from steptrail.domain.run import Run
from steptrail.projections.run_index import (
    COLUMN_FIELDS,
    DOCUMENT_ONLY_EVENTS,
    column_values,
    document_json,
    document_only,
    split_state,
)


def running() -> Run:
    run = Run.enqueue(run_id=uuid.uuid4(), agent="a", request_digest="d", actor="t")
    run.claim(holder="w", lease_ms=1000)
    run.mark_committed()
    return run


def test_document_json__same_content_as_split_state() -> None:
    """The columns and the document (JSON text, one call) hold what split_state gives,
    for states with markers, waiting, decisions, failures and non-ASCII text."""
    run = running()
    run.mark_effect_pending(tool="send", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="llm", name="é", duration_ms=1, tokens=3, cost=0.1)
    states = [run.state]
    run.suspend(kind=WaitKind.APPROVAL, digest="dg", pending_tools=("send",))
    states.append(run.state)
    run.decide(kind=WaitKind.APPROVAL, approved=True, by="op", digest="dg")
    states.append(run.state)
    run.resume(holder="resume:x", lease_ms=500)
    states.append(run.state)
    other = running()
    other.requeue(delay_ms=5, failure_class=FailureClass.RATE_LIMIT, error_type="Über")
    states.append(other.state)
    for state in states:
        assert column_values(state) == split_state(state)[0]
        document = json.loads(document_json(state))
        assert document == split_state(state)[1]
        assert not set(document) & set(COLUMN_FIELDS)


def test_document_only__events_change_no_column_but_version() -> None:
    """Each document-only event, folded onto a running run, leaves every other column alone
    (the SQLite append rewrites only version, document and lease for them)."""
    run = running()
    columns = [f for f in COLUMN_FIELDS if f != "version"]
    before = [getattr(run.state, f) for f in columns]
    run.mark_effect_pending(tool="send", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="send", duration_ms=1)
    run.renew_lease()
    run.record_replay(count=1, last_seq=1)
    run.record_step(kind="llm", name="x", duration_ms=1, error_type="E")
    assert {type(e) for e in run.pending_events} == set(DOCUMENT_ONLY_EVENTS)
    assert document_only(run.pending_events)
    assert [getattr(run.state, f) for f in columns] == before
    run.complete(result={})
    assert not document_only(run.pending_events)
