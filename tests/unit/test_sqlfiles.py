"""Named SQL: the same query names per backend, numbered migrations in step."""

from __future__ import annotations

import pytest

from steptrail.infrastructure.sqlfiles import migrations, parse, queries

# Queries only one backend needs, with the reason.
BACKEND_ONLY: dict[str, str] = {
    "append": "PostgreSQL: one function call does what SQLite's next four statements do",
    "insert_events": "SQLite: part of an append (PostgreSQL: steptrail_append)",
    "update_run": "SQLite: part of an append (PostgreSQL: steptrail_append)",
    "put_saved": "SQLite: part of an append (PostgreSQL: steptrail_append)",
    "drop_saved": "SQLite: part of an append (PostgreSQL: steptrail_append)",
    "insert_journal": "SQLite: part of an append (PostgreSQL: steptrail_append)",
    "drop_journal": "SQLite: part of an append (PostgreSQL: steptrail_append)",
    "drop_journal_without_request": "SQLite: part of a failed settle (PostgreSQL: a CTE of "
    "drop_saved_but_request)",
    "append_event": "SQLite: part of an append (PostgreSQL: steptrail_append)",
    "update_run_document": "SQLite: part of an append (PostgreSQL: steptrail_append)",
    "append_one": "PostgreSQL: `append` with scalar parameters (SQLite binds each statement)",
    "append_two": "PostgreSQL: `append` with scalar parameters (SQLite binds each statement)",
    "next_due": "PostgreSQL: steptrail_next_due walks every queue and level in one call (ADR 0082)",
    "next_due_at": "SQLite: one level's earliest due time; sqlite_wake walks the levels",
    **dict.fromkeys(
        ("keyed_due_queue_after", "keyed_next_due_at", "keyed_came_due_at"),
        "SQLite: the keyed due index's walk for an idle worker's wait, statement by statement "
        "(PostgreSQL: steptrail_next_due; ADR 0087)",
    ),
    "migration_lock": "PostgreSQL: an advisory lock; SQLite's BEGIN IMMEDIATE is the lock",
    "lock_as_writer": "PostgreSQL: SQLite's BEGIN IMMEDIATE already stops every writer",
    "acquire_rate_grant": "PostgreSQL: one statement under the limit's lock does what "
    "SQLite's next three do (ADR 0080)",
    **dict.fromkeys(
        ("prune_rate_grants", "window_rate_use", "insert_rate_grant"),
        "SQLite: part of an acquire (PostgreSQL: acquire_rate_grant)",
    ),
    **dict.fromkeys(
        ("lock_range", "upsert_row", "insert_missing_row", "delete_rows"),
        "PostgreSQL: a range of the run index is rebuilt under its rows' locks; SQLite's "
        "BEGIN IMMEDIATE holds every writer for the range (ADR 0040)",
    ),
    **dict.fromkeys(
        ("delete_range_rows", "insert_row"),
        "SQLite: a range is rebuilt under the write lock, its rows deleted and inserted "
        "(ADR 0040); insert_row also bulk-loads (PostgreSQL: COPY)",
    ),
    "listen_queued": "PostgreSQL: SQLite has no LISTEN; its workers poll",
    **dict.fromkeys(
        ("vacuum_memory", "set_vacuum_memory", "reset_vacuum_memory"),
        "PostgreSQL: after_purge's VACUUM is given the memory its dead rows need (ADR 0065); "
        "SQLite's after_purge checkpoints",
    ),
    "claim_rows": "SQLite: PostgreSQL's claim updates the rows in its one statement",
    **dict.fromkeys(
        ("claim_queue_after", "claim_level_below"),
        "SQLite: the claim's walk of queues and priority levels, statement by statement in its "
        "write transaction (PostgreSQL: recursive CTEs of steptrail_claim; ADR 0077)",
    ),
    **dict.fromkeys(
        ("claim_keys_ready", "claim_keyed", "rotate_key"),
        "SQLite: the claim's walk of concurrency keys in its write transaction (PostgreSQL: "
        "the ready, keyed and rotated parts of steptrail_claim; ADR 0078)",
    ),
    "set_priority": "PostgreSQL: PriorityChanged's column, as steptrail_append writes none "
    "(SQLite: update_run sets it; ADR 0077)",
    "insert_runs": "PostgreSQL: enqueue_many's one statement per batch (SQLite: executemany "
    "of insert_events, insert_run, put_saved in one transaction; ADR 0044)",
    **dict.fromkeys(
        ("copy_events", "copy_runs", "copy_saved"),
        "PostgreSQL: bulk_load_settled's COPY (SQLite: executemany; ADR 0044)",
    ),
    **dict.fromkeys(
        (
            "restored_positions",
            "restored_tx_map",
            "restored_tx_count",
            "renumber_events",
            "renumber_purged_events",
            "renumber_tracking",
            "renumber_projection_failures",
            "advance_tx_ids",
        ),
        "PostgreSQL: a restored database's positions are the old server's (ADR 0046)",
    ),
}


def test_queries__same_names_on_both_backends() -> None:
    """PostgreSQL and SQLite define exactly the same named queries."""
    pg, lite = set(queries("postgres")), set(queries("sqlite"))
    assert pg - lite == set(BACKEND_ONLY) & pg
    assert lite - pg == set(BACKEND_ONLY) & lite


def test_migrations__numbered_alike_and_in_order() -> None:
    """Both backends have the same migrations, numbered from 1 upwards, each number once.
    Numbers are reserved per change, so one may be missing until its change lands; a
    database applies whatever numbers it has not applied yet."""
    pg = [(n, name) for n, name, _ in migrations("postgres")]
    lite = [(n, name) for n, name, _ in migrations("sqlite")]
    assert pg == lite
    numbers = [n for n, _ in pg]
    assert numbers[0] == 1
    assert numbers == sorted(set(numbers))


def test_parse__rejects_a_name_defined_twice() -> None:
    """A queries file cannot define the same name twice."""
    with pytest.raises(ValueError, match="twice"):
        parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_parse__keeps_bodies_without_trailing_semicolon() -> None:
    """Each block's SQL is its text up to the next name, trimmed."""
    assert parse("-- name: a\n-- why\nSELECT 1;\n\n-- name: b\nSELECT 2;") == {
        "a": "-- why\nSELECT 1",
        "b": "SELECT 2",
    }


def test_with_claim__each_append_query_becomes_its_claiming_call() -> None:
    """The claiming settles (ADR 0058) are the append queries with the claim's arguments
    appended: every argument of the append is kept, in order, and anything that is not a
    call of steptrail_append is refused rather than rewritten."""
    from steptrail.infrastructure.postgres import APPENDS, with_claim

    named = queries("postgres")
    for name in APPENDS:
        derived = with_claim(named[name])
        head, _, call = derived.partition("steptrail_append_claim(")
        assert head.strip().endswith("SELECT (c.run).*, c.request FROM")
        original = named[name].partition("steptrail_append(")[2].rstrip().removesuffix(";")
        assert call.startswith(original.removesuffix(")"))
        assert call.endswith(
            "%(c_lease_ms)s::bigint, %(c_queues)s::text[]) AS c ORDER BY (c.run).run_id"
        )
    with pytest.raises(ValueError, match="steptrail_append"):
        with_claim(named["claim"])
