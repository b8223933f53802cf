"""The run store's contract, held against SQLite and PostgreSQL alike, and on PostgreSQL
both by the pooled store (workers) and the one-shot one (one kept connection, ADR 0056)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from steptrail.domain.enums import (
    Effect,
    FailureClass,
    RetryMode,
    RunStatus,
    TerminationReason,
    WaitKind,
)
from steptrail.domain.errors import VersionConflict
from steptrail.domain.journal import JournalEntry, StepCall
from steptrail.domain.ports import ClaimRequest
from steptrail.domain.run import Run, fold
from steptrail.infrastructure.factory import open_store
from steptrail.projections.run_index import normalise, rebuild_row

AGENTS = ["a"]


@pytest.fixture(params=["sqlite", "postgres", "postgres-one-shot"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An empty store of each backend, and PostgreSQL's one-shot store besides."""
    one_shot = request.param == "postgres-one-shot"
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    s = open_store(url, one_shot=one_shot)
    yield s
    s.close()


def queued(store: Any, *, key: str | None = None, agent: str = "a", body: bytes = b"{}") -> Run:
    run = Run.enqueue(
        run_id=uuid.uuid4(), agent=agent, request_digest="d", actor="test", idempotency_key=key
    )
    return store.create(run, request=body)  # type: ignore[no-any-return]


def test_create__saves_request_and_is_claimable_at_once(store: Any) -> None:
    """A just-enqueued run is claimable in the very next call, with its saved request."""
    run = queued(store, body=b'{"x": 1}')
    claimed = store.claim(holder="w", lease_ms=60_000, agents=AGENTS)
    assert claimed is not None
    assert claimed.run.id == run.id
    assert claimed.request == b'{"x": 1}'
    assert claimed.run.status is RunStatus.RUNNING
    assert claimed.run.state.holder == "w"
    assert claimed.run.state.claim_version == 2


def test_claim__the_claimed_run_is_the_stored_one_and_its_age_the_stores(store: Any) -> None:
    """What a claim returns is the whole run, as a read of it finds it just after, with its
    saved request; its age is from its creation to the claim, by the store's clock; and the
    settle's claim (ADR 0058) returns the same."""
    first = queued(store, key="k-1", body=b'{"n": 1}')
    queued(store, agent="a")
    time.sleep(0.2)
    claimed = store.claim(holder="w", lease_ms=60_000, agents=AGENTS)
    assert claimed is not None
    assert claimed.run.id == first.id
    assert claimed.run.state == store.load(first.id).state
    assert claimed.run.state.idempotency_key == "k-1"
    assert claimed.run.committed_version == 2
    assert claimed.request == b'{"n": 1}'
    assert 0.2 <= claimed.age_s < 30
    run = claimed.run
    run.complete(result={"ok": True})
    (chained,) = store.append(
        run, then_claim=ClaimRequest(holder="w2", lease_ms=60_000, agents=tuple(AGENTS))
    )
    assert chained.run.state == store.load(chained.run.id).state
    assert chained.run.state.holder == "w2"
    assert chained.request == b"{}"
    assert 0.2 <= chained.age_s < 30


def test_create__idempotency_key_returns_existing_run(store: Any) -> None:
    """A second enqueue with the same key returns the first run and writes nothing."""
    first = queued(store, key="k")
    second = queued(store, key="k", body=b'{"other": true}')
    assert second.id == first.id
    assert len(store.history(first.id)) == 1
    assert store.request(first.id) == b"{}"


def test_claim__each_run_once_in_fifo_order(store: Any) -> None:
    """Claims hand out runs oldest first, each exactly once, then nothing."""
    ids = [queued(store).id for _ in range(3)]
    got = []
    while (c := store.claim(holder="w", lease_ms=60_000, agents=AGENTS)) is not None:
        got.append(c.run.id)
    assert got == ids


def test_claim__ignores_other_agents(store: Any) -> None:
    """A worker claims only runs of the agents it can execute."""
    queued(store, agent="b")
    assert store.claim(holder="w", lease_ms=60_000, agents=AGENTS) is None
    assert store.claim(holder="w", lease_ms=60_000, agents=["b"]) is not None


def test_append__fenced_on_version(store: Any) -> None:
    """An append at a version somebody already used conflicts and writes nothing."""
    queued(store)
    claimed = store.claim(holder="w", lease_ms=60_000, agents=AGENTS)
    live, zombie = claimed.run, store.load(claimed.run.id)
    live.record_step(kind="llm", name="one", duration_ms=1)
    store.append(live)
    zombie.record_step(kind="llm", name="stale", duration_ms=1)
    with pytest.raises(VersionConflict):
        store.append(zombie)
    names = [getattr(e.event, "name", None) for e in store.history(live.id)]
    assert "stale" not in names
    assert store.load(live.id).state == live.state


def test_append__settle_drops_saved_request(store: Any) -> None:
    """Settling a run deletes its saved request in the same transaction."""
    queued(store)
    run = store.claim(holder="w", lease_ms=60_000, agents=AGENTS).run
    assert store.request(run.id) is not None
    run.complete()
    store.append(run)
    assert store.request(run.id) is None
    assert store.load(run.id).status is RunStatus.COMPLETED


def test_append__resumable_state_saved_and_dropped(store: Any) -> None:
    """Suspending saves resumable state beside the log; cancelling drops it."""
    queued(store)
    run = store.claim(holder="w", lease_ms=60_000, agents=AGENTS).run
    run.suspend(kind=WaitKind.APPROVAL, digest="sha256:x", pending_tools=("send",))
    store.append(run, resumable=b'{"conversation": []}')
    assert store.saved(run.id, "resumable") == b'{"conversation": []}'
    assert store.stale(10) == []
    run.cancel(actor="op")
    store.append(run)
    assert store.saved(run.id, "resumable") is None


def test_requeue__not_claimable_before_its_delay(store: Any) -> None:
    """A requeued run honours its backoff: invisible to claims until its time comes."""
    queued(store)
    run = store.claim(holder="w", lease_ms=60_000, agents=AGENTS).run
    run.requeue(delay_ms=400, failure_class=FailureClass.SERVER_ERROR, error_type="E")
    store.append(run)
    assert store.claim(holder="w", lease_ms=60_000, agents=AGENTS) is None
    time.sleep(0.5)
    again = store.claim(holder="w2", lease_ms=60_000, agents=AGENTS)
    assert again is not None
    assert again.run.state.requeue_count == 1


def test_stale__only_expired_leases_oldest_first(store: Any) -> None:
    """The stale scan returns expired running runs by deadline, and nothing else."""
    queued(store)
    queued(store)
    queued(store)
    first = store.claim(holder="w", lease_ms=50, agents=AGENTS).run
    second = store.claim(holder="w", lease_ms=150, agents=AGENTS).run
    store.claim(holder="w", lease_ms=60_000, agents=AGENTS)
    time.sleep(0.3)
    assert [r.id for r in store.stale(10)] == [first.id, second.id]
    assert [r.id for r in store.stale(1)] == [first.id]


def test_stale__heartbeat_moves_deadline(store: Any) -> None:
    """Any append by the holder renews the lease from the store's clock."""
    queued(store)
    run = store.claim(holder="w", lease_ms=300, agents=AGENTS).run
    time.sleep(0.2)
    run.record_step(kind="llm", name="beat", duration_ms=1)
    store.append(run)
    time.sleep(0.2)
    assert store.stale(10) == []


def test_history__replay_equals_stored_state(store: Any) -> None:
    """Folding the stored events reproduces the state the index holds."""
    queued(store)
    run = store.claim(holder="w", lease_ms=60_000, agents=AGENTS).run
    run.mark_effect_pending(tool="send", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="send", duration_ms=3, payload={"tool": "send"})
    store.append(run)
    run.dead_letter(actor="w", reason=TerminationReason.NOT_RETRYABLE, cause="test")
    store.append(run)
    history = store.history(run.id)
    assert [h.version for h in history] == list(range(1, len(history) + 1))
    assert fold(h.event for h in history) == store.load(run.id).state


def test_index__rebuild_from_log_equals_live(store: Any) -> None:
    """Every live index row equals the row rebuilt from its events and their store times."""
    queued(store)
    queued(store, key="k")
    r = store.claim(holder="w", lease_ms=60_000, agents=AGENTS).run
    r.record_step(kind="llm", name="s", duration_ms=1)
    store.append(r)
    r.requeue(delay_ms=1234, failure_class=FailureClass.RATE_LIMIT, error_type="E")
    store.append(r)
    other = store.claim(holder="w", lease_ms=60_000, agents=AGENTS).run
    other.cancel(actor="op")
    store.append(other)
    for row in store.all_rows():
        history = store.history(row.run_id)
        rebuilt = rebuild_row((h.event, h.recorded_at) for h in history)
        assert rebuilt is not None
        assert normalise(rebuilt) == normalise(row)


def test_index__document_only_appends_equal_the_rebuild(store: Any) -> None:
    """Appends of steps, markers, renewals and replay notes (which rewrite only the version,
    document and lease of the row on SQLite, ADR 0039) leave the row equal to its rebuild,
    lease included, and a later settle still updates every column."""
    queued(store)
    run = store.claim(holder="w", lease_ms=60_000, agents=AGENTS).run
    run.mark_effect_pending(tool="send", effect=Effect.NON_IDEMPOTENT_WRITE)
    store.append(run)
    run.record_step(kind="tool", name="send", duration_ms=1, tokens=2, cost=0.5)
    run.renew_lease()
    store.append(run)
    run.record_replay(count=1, last_seq=1)
    run.record_step(kind="llm", name="two", duration_ms=1)
    store.append(run)

    def check(expected: RunStatus) -> None:
        row = store.row(run.id)
        assert row.state == run.state
        assert row.status is expected
        history = store.history(run.id)
        rebuilt = rebuild_row((h.event, h.recorded_at) for h in history)
        assert rebuilt is not None
        assert normalise(rebuilt) == normalise(row)
        assert (row.lease_expires_at is None) is (expected is RunStatus.COMPLETED)

    check(RunStatus.RUNNING)
    run.complete(result={})
    store.append(run)
    check(RunStatus.COMPLETED)


def test_migrate__idempotent(store: Any) -> None:
    """Migrating an up-to-date database applies nothing and reports nothing pending."""
    assert store.pending_migrations() == []
    assert store.migrate() == []


def journaled(store: Any) -> Run:
    """A claimed run with two steps appended, each with its journal entry."""
    queued(store)
    claimed = store.claim(holder="w", lease_ms=60_000, agents=AGENTS)
    run: Run = claimed.run
    for k in (1, 2):
        entry = JournalEntry.of_value(k, StepCall("llm", f"s{k}", "f" * 16), {"k": k})
        run.record_step(kind="llm", name=f"s{k}", duration_ms=1, journal=entry)
    store.append(run)
    return run


def test_journal__written_with_its_steps_in_one_append(store: Any) -> None:
    """The entries of a batch of steps land with their records, numbered as the steps."""
    run = journaled(store)
    entries = store.journal(run.id)
    assert [(e.seq, e.position, e.name, e.value) for e in entries] == [
        (1, 1, "s1", {"k": 1}),
        (2, 2, "s2", {"k": 2}),
    ]


def test_journal__fenced_append_writes_no_entry(store: Any) -> None:
    """An append that loses the fence writes neither its events nor its journal entries."""
    run = journaled(store)
    zombie = store.load(run.id)
    run.renew_lease()
    store.append(run)
    entry = JournalEntry.of_value(3, StepCall("llm", "s3", "f" * 16), "late")
    zombie.record_step(kind="llm", name="s3", duration_ms=1, journal=entry)
    with pytest.raises(VersionConflict):
        store.append(zombie)
    assert [e.seq for e in store.journal(run.id)] == [1, 2]


def test_journal__deleted_by_the_settling_append(store: Any) -> None:
    """Settling deletes the run's journal in the same append, and writes none of its own."""
    run = journaled(store)
    entry = JournalEntry.of_value(3, StepCall("llm", "s3", "f" * 16), "last")
    run.record_step(kind="llm", name="s3", duration_ms=1, journal=entry)
    run.complete()
    store.append(run)
    assert store.journal(run.id) == []
    assert [type(h.event).__name__ for h in store.history(run.id)][-2:] == [
        "StepRecorded",
        "Completed",
    ]


def failed_journaled(store: Any) -> Run:
    """`journaled`, then a third step that raised, appended with the dead-letter."""
    run = journaled(store)
    entry = JournalEntry(0, 3, "llm", "s3", "f" * 16, error_type="KeyError", error_message="'x'")
    run.record_step(kind="llm", name="s3", duration_ms=1, error_type="KeyError", journal=entry)
    run.dead_letter(actor="w", reason=TerminationReason.NOT_RETRYABLE, cause="bug")
    store.append(run)
    return run


def test_journal__kept_by_a_failed_settle_with_its_last_steps(store: Any) -> None:
    """A run that settles failed keeps its journal and its request, and the settling append
    writes the entries it carries (the step that raised), so a retry can resume (ADR 0070)."""
    run = failed_journaled(store)
    entries = store.journal(run.id)
    assert [(e.seq, e.position, e.failed) for e in entries] == [
        (1, 1, False),
        (2, 2, False),
        (3, 3, True),
    ]
    assert entries[2].error_type == "KeyError"
    assert store.saved(run.id, "request") is not None


@pytest.mark.parametrize(
    ("mode", "position", "kept"),
    [(RetryMode.RESUME, 3, [1, 2, 3]), (RetryMode.FROM, 2, [1]), (RetryMode.FROM, 1, [])],
)
def test_journal__retry_from_drops_the_entries_from_its_position(
    store: Any, mode: RetryMode, position: int, kept: list[int]
) -> None:
    """A `Retried` in mode `from` deletes the entries at its position and later in the same
    append; a resuming one deletes nothing."""
    run = failed_journaled(store)
    run.retry(actor="op", mode=mode, position=position)
    store.append(run)
    assert [e.seq for e in store.journal(run.id)] == kept
    assert store.load(run.id).status is RunStatus.QUEUED


def test_journal__a_retry_that_loses_the_fence_drops_nothing(store: Any) -> None:
    """Two retries read the same failed run; the one whose append conflicts deletes none of
    the journal (its cut rides in the fenced transaction)."""
    run = failed_journaled(store)
    other = store.load(run.id)
    run.retry(actor="alice", mode=RetryMode.RESUME, position=3)
    store.append(run)
    other.retry(actor="bob", mode=RetryMode.FROM, position=1)
    with pytest.raises(VersionConflict):
        store.append(other)
    assert [e.seq for e in store.journal(run.id)] == [1, 2, 3]
    assert [type(h.event).__name__ for h in store.history(run.id)].count("Retried") == 1


ODD_NAMES = [
    'quote " and \\ backslash',
    "line\nbreak\ttab\x1b[31m",
    "naïve 💥 名前",
    "",
    "x" * 5000,
]


def test_journal__entries_ride_with_their_own_steps_whatever_they_hold(store: Any) -> None:
    """In one append of mixed events (a marker, a step without an entry, steps with one),
    each entry comes back whole with its own step's number: odd names, an error, a nested
    value and one too big for a page, byte for byte (ADR 0050 packs them on SQLite)."""
    queued(store)
    claimed = store.claim(holder="w", lease_ms=60_000, agents=AGENTS)
    run: Run = claimed.run
    run.mark_effect_pending(tool="send", effect=Effect.NON_IDEMPOTENT_WRITE)
    run.record_step(kind="tool", name="send", duration_ms=1)  # no entry
    expected = []
    values: list[Any] = [{"deep": [[[{"k": "\x00"}]]], "n": 2**62}, -0.5, True, "y" * 50_000, None]
    for k, (name, value) in enumerate(zip(ODD_NAMES, values, strict=True), start=2):
        call = StepCall("llm", name, "f" * 16)
        if k == 3:
            entry = JournalEntry(
                0,
                k - 1,
                "llm",
                name,
                "f" * 16,
                error_type="Boom",
                error_message='boom \\" 💥',
                failure_class=FailureClass.RATE_LIMIT,
            )
        else:
            entry = JournalEntry.of_value(k - 1, call, value)
        run.record_step(kind="llm", name=name, duration_ms=1, journal=entry)
        expected.append((k, k - 1, name, entry.value, entry.error_type, entry.error_message))
    store.append(run)
    got = [
        (e.seq, e.position, e.name, e.value, e.error_type, e.error_message)
        for e in store.journal(run.id)
    ]
    assert got == expected
    assert store.journal(run.id)[1].failure_class is FailureClass.RATE_LIMIT


def test_journal__kept_across_a_requeue(store: Any) -> None:
    """A requeue is not a settle: the journal stays for the next segment to replay."""
    run = journaled(store)
    run.requeue(delay_ms=0, failure_class=FailureClass.SERVER_ERROR, error_type="E")
    store.append(run)
    assert [e.seq for e in store.journal(run.id)] == [1, 2]


def _step(run: Run, name: str) -> None:
    seq = run.state.steps + 1
    entry = JournalEntry.of_value(seq, StepCall("llm", name, "f" * 16), {"name": name})
    run.record_step(kind="llm", name=name, duration_ms=1, journal=entry)


@pytest.mark.parametrize(
    "shape",
    [
        "step",  # one event, one entry (PostgreSQL: append_one)
        "renewal",  # one event, no entry (append_one)
        "replay_and_step",  # two events, one entry (append_two)
        "marker_and_renewal",  # two events, no entry (append_two)
        "step_and_settle",  # two events, the entry dropped by the settle (append_two)
        "two_steps",  # two events, two entries (append)
        "three_events",  # (append)
    ],
)
def test_append__every_shape_lands_whole_and_fenced(store: Any, shape: str) -> None:
    """Whatever the number of events and journal entries an append carries (PostgreSQL
    sends the common shapes with scalar parameters, ADR 0039/0053), every event lands at its
    version in order, the journal gets exactly the entries of the steps, the row equals the
    run and its rebuild, and a stale writer of the same shape conflicts and writes nothing."""
    queued(store)
    run = store.claim(holder="w", lease_ms=60_000, agents=AGENTS).run
    _step(run, "s1")
    store.append(run)
    zombie = store.load(run.id)
    commands = {
        "step": lambda r: _step(r, "s2"),
        "renewal": lambda r: r.renew_lease(),
        "replay_and_step": lambda r: (r.record_replay(count=1, last_seq=1), _step(r, "s2")),
        "marker_and_renewal": lambda r: (
            r.mark_effect_pending(tool="send", effect=Effect.IDEMPOTENT_WRITE),
            r.renew_lease(),
        ),
        "step_and_settle": lambda r: (_step(r, "s2"), r.complete(result={"ok": True})),
        "two_steps": lambda r: (_step(r, "s2"), _step(r, "s3")),
        "three_events": lambda r: (_step(r, "s2"), r.renew_lease(), _step(r, "s3")),
    }
    commands[shape](run)
    expected = [(run.committed_version + i + 1, e) for i, e in enumerate(run.pending_events)]
    steps_written = [q for q, _ in run.pending_journal]
    store.append(run)

    history = store.history(run.id)
    assert [(h.version, h.event) for h in history[-len(expected) :]] == expected
    assert [h.version for h in history] == list(range(1, run.version + 1))
    journal = [e.seq for e in store.journal(run.id)]
    settled = run.status is RunStatus.COMPLETED
    assert journal == ([] if settled else [1, *steps_written])
    row = store.row(run.id)
    assert row.state == run.state
    rebuilt = rebuild_row((h.event, h.recorded_at) for h in history)
    assert rebuilt is not None
    assert normalise(rebuilt) == normalise(row)

    commands[shape](zombie)
    with pytest.raises(VersionConflict):
        store.append(zombie)
    assert [(h.version, h.event) for h in store.history(run.id)] == [
        (h.version, h.event) for h in history
    ]
    assert [e.seq for e in store.journal(run.id)] == journal
    assert store.load(run.id).state == run.state


NEXT = ClaimRequest(holder="w2", lease_ms=60_000, agents=("a",), limit=1)


@pytest.mark.parametrize(
    "shape",
    [
        "complete",  # one event (PostgreSQL: append_one_claim)
        "step_and_complete",  # two events (append_two_claim)
        "steps_and_complete",  # three events (append_claim)
        "requeue",  # back on the queue with a backoff: not claimable by its own settle
        "requeue_now",  # without one
        "fail",  # keeps its request: PostgreSQL's two-statement settle, which claims nothing
    ],
)
def test_append_then_claim__settles_then_claims_in_one_write_fenced(store: Any, shape: str) -> None:
    """A settle that also claims (ADR 0058) lands whole, then claims the next run as a claim
    would: oldest first, at its next version, under the new holder's lease, with its saved
    request; the rest stay queued. A stale writer's settle of the same shape conflicts and
    claims nothing: the claim never outlives its append's fence."""
    queued(store)
    run = store.claim(holder="w", lease_ms=60_000, agents=AGENTS).run
    zombie = store.load(run.id)
    _step(run, "s1")
    store.append(run)
    first, second = queued(store, body=b'{"n": 1}'), queued(store, body=b'{"n": 2}')
    commands = {
        "complete": lambda r: r.complete(result={"ok": True}),
        "step_and_complete": lambda r: (_step(r, "s2"), r.complete(result={"ok": True})),
        "steps_and_complete": lambda r: (
            _step(r, "s2"),
            _step(r, "s3"),
            r.complete(result={"ok": True}),
        ),
        "requeue": lambda r: r.requeue(
            delay_ms=60_000, failure_class=FailureClass.SERVER_ERROR, error_type="E"
        ),
        "requeue_now": lambda r: r.requeue(
            delay_ms=0, failure_class=FailureClass.SERVER_ERROR, error_type="E"
        ),
        "fail": lambda r: r.fail(reason=TerminationReason.NOT_RETRYABLE),
    }

    commands[shape](zombie)
    with pytest.raises(VersionConflict):
        store.append(zombie, then_claim=NEXT)
    for other in (first, second):
        assert store.load(other.id).status is RunStatus.QUEUED
        assert len(store.history(other.id)) == 1

    commands[shape](run)
    claimed = store.append(run, then_claim=NEXT)

    assert store.load(run.id).state == run.state
    assert store.request(first.id) == b'{"n": 1}'
    if shape == "fail" and not claimed:  # allowed: the worker then claims as usual
        assert store.load(first.id).status is RunStatus.QUEUED
        return
    assert [c.run.id for c in claimed] == [first.id]
    got = claimed[0]
    assert got.request == b'{"n": 1}'
    assert got.run.status is RunStatus.RUNNING
    assert got.run.state.holder == "w2"
    assert got.run.version == got.run.committed_version == 2
    assert got.run.state.claim_version == 2
    assert store.load(first.id).state == got.run.state
    history = store.history(first.id)
    assert [type(h.event) for h in history] == [Run.Queued, Run.Claimed]
    rebuilt = rebuild_row((h.event, h.recorded_at) for h in history)
    assert rebuilt is not None
    assert normalise(rebuilt) == normalise(store.row(first.id))
    assert store.load(second.id).status is RunStatus.QUEUED


def test_append_then_claim__nothing_to_claim_and_other_agents(store: Any) -> None:
    """With nothing claimable (an empty queue, or only other agents' runs) the settle still
    lands and claims nothing; a plain append returns nothing to claim either."""
    queued(store)
    run = store.claim(holder="w", lease_ms=60_000, agents=AGENTS).run
    _step(run, "s1")
    assert store.append(run) == []
    other = queued(store, agent="b")
    run.complete(result={})
    assert store.append(run, then_claim=NEXT) == []
    assert store.load(run.id).status is RunStatus.COMPLETED
    assert store.load(other.id).status is RunStatus.QUEUED
