"""Migration 0020 on SQLite (ADR 0050): the journal moves from its own table into the event
rows of its runs, every entry whole, the log's own columns untouched. (On PostgreSQL the
migration changes nothing; tests/integration/test_upgrade.py upgrades both backends from
every fixture version, journal included.)"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

from steptrail.domain.enums import FailureClass
from steptrail.infrastructure.factory import open_store

ENTRIES = {
    # run: [(seq, position, kind, name, fingerprint, outcome)]
    "a": [
        (1, 1, "llm", "think", "0" * 16, b'{"value":"t1"}'),
        (
            2,
            2,
            "tool",
            'odd "name" \\ 💥',
            "1" * 16,
            b'{"error":{"type":"E","message":"m","class":"rate_limit"}}',
        ),
        (3, 2, "tool", 'odd "name" \\ 💥', "1" * 16, b'{"value":{"deep":[1,2.5,null,true]}}'),
    ],
    "b": [(1, 1, "llm", "only", "2" * 16, b'{"value":"' + b"x" * 20_000 + b'"}')],
    "c": [],
}
EVENTS = {"a": 7, "b": 3, "c": 4}


def test_migration_0020__moves_every_entry_into_its_runs_events(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v19.db'}"
    store = open_store(url, ensure_schema=False)
    try:
        store.migrate(upto=19)
    finally:
        store.close()
    ids = {name: uuid.uuid4() for name in ENTRIES}
    path = tmp_path / "v19.db"
    with sqlite3.connect(path) as conn:  # the rows as the schema-19 code wrote them
        for name, run_id in ids.items():
            for version in range(1, EVENTS[name] + 1):
                conn.execute(
                    "INSERT INTO steptrail_events (originator_id, originator_version, topic,"
                    " state, recorded_at) VALUES (?, ?, ?, ?, ?)",
                    (run_id.hex, version, f"topic-{version}", b"state-%d" % version, version),
                )
            for row in ENTRIES[name]:
                conn.execute(
                    "INSERT INTO steptrail_journal VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (run_id.hex, *row),
                )
        log_before = conn.execute(
            "SELECT notification_id, originator_id, originator_version, topic, state,"
            " recorded_at FROM steptrail_events ORDER BY notification_id"
        ).fetchall()
    store = open_store(url, ensure_schema=False)
    try:
        assert store.migrate()[0] == "0020_journal_in_the_event_row"
        assert store.pending_migrations() == []
        a = store.journal(ids["a"])
        assert [(e.seq, e.position, e.kind, e.name, e.fingerprint) for e in a] == [
            r[:5] for r in ENTRIES["a"]
        ]
        assert a[0].value == "t1"
        assert (a[1].error_type, a[1].error_message) == ("E", "m")
        assert a[1].failure_class is FailureClass.RATE_LIMIT
        assert a[2].value == {"deep": [1, 2.5, None, True]}
        (b,) = store.journal(ids["b"])
        assert b.value == "x" * 20_000
        assert store.journal(ids["c"]) == []
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE name = 'steptrail_journal'"
        ).fetchone() == (0,)
        log_after = conn.execute(
            "SELECT notification_id, originator_id, originator_version, topic, state,"
            " recorded_at FROM steptrail_events ORDER BY notification_id"
        ).fetchall()
        assert log_after == log_before
        carried = conn.execute(
            "SELECT originator_id, count(*) FROM steptrail_events WHERE journal IS NOT NULL"
            " GROUP BY originator_id"
        ).fetchall()
        assert dict(carried) == {ids["a"].hex: 3, ids["b"].hex: 1}
