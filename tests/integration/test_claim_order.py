"""PostgreSQL: a multi-row claim's events are read in version order (ADR 0018).

A claim takes its transaction id at its first row; the view runner reads the log by
(transaction, id). A later row that another transaction changed and committed while the claim
was busy is re-checked by PostgreSQL before the claim locks it: were it claimed, its Claimed
would sort before the other transaction's events of the same run. It is not claimed, because
availability is judged at the claim's start and every change to a queued run leaves it either
not queued or available later than that. This test builds exactly that interleaving. (SQLite
has one writer at a time: its ids commit in order, there is nothing to prove there.)
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from steptrail.domain.enums import FailureClass, RunStatus
from tests.conftest import make_runtime


def test_claim__row_changed_during_a_multi_row_claim_keeps_read_order(pg_url: str) -> None:
    """While a two-row claim sleeps inside its first row, the second run is claimed and
    requeued by others; the first claim does not take it, and every run's events are read
    in version order (the views fold cleanly, verify is clean)."""
    rt = make_runtime(pg_url)
    store: Any = rt.store
    first = rt.enqueue("scripted", {})
    time.sleep(0.01)
    second = rt.enqueue("scripted", {})
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION steptrail_test_slow() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN IF NEW.originator_id = '" + str(first) + "' AND NEW.originator_version = 2 "
            "THEN PERFORM pg_sleep(1.5); END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER steptrail_test_slow BEFORE INSERT ON steptrail_events "
            "FOR EACH ROW EXECUTE FUNCTION steptrail_test_slow()"
        )
    try:
        got: dict[str, Any] = {}
        claimer = threading.Thread(
            target=lambda: got.update(
                runs=store.claim_batch(
                    holder="worker:slow", lease_ms=60_000, agents=["scripted"], limit=2
                )
            )
        )
        claimer.start()
        time.sleep(0.4)  # the slow claim holds the first run and sleeps in its insert
        (other,) = store.claim_batch(
            holder="worker:other", lease_ms=60_000, agents=["scripted"], limit=2
        )
        assert other.run.id == second
        other.run.requeue(delay_ms=0, failure_class=FailureClass.CONNECTION, error_type=None)
        store.append(other.run)  # queued again, available at once: after the slow claim began
        claimer.join(10)
        assert [c.run.id for c in got["runs"]] == [first]
        assert rt.get(second).status is RunStatus.QUEUED
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER steptrail_test_slow ON steptrail_events")
            conn.execute("DROP FUNCTION steptrail_test_slow()")
    rt.project()
    for run_id in (first, second):
        versions = [
            n.version
            for n in rt.views.notifications(upto=rt.views.position())
            if n.run_id == run_id
        ]
        assert versions == sorted(versions)
        assert versions == list(range(1, len(versions) + 1))
    assert rt.verify() == []
    rt.close()
