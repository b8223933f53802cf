"""Open the store a database URL names, with its schema in place."""

from __future__ import annotations

import re
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from steptrail.domain.errors import StoreUnavailable
from steptrail.infrastructure.logging import steptrail_logger
from steptrail.infrastructure.sqlfiles import migrations
from steptrail.infrastructure.store_base import ReadOnlyStore

if TYPE_CHECKING:  # each store is imported when a URL of its backend is opened: psycopg
    # costs a SQLite process, and sqlite3 with the eventsourcing library a PostgreSQL one
    from steptrail.infrastructure.postgres import PostgresRunStore
    from steptrail.infrastructure.sqlite import SQLiteRunStore


class SchemaMissing(RuntimeError):
    """The database has no steptrail schema (or an old one) and this open may not migrate
    it: auto-migration is off, or the caller only reads (ADR 0074)."""


def shown_url(url: str) -> str:
    """`url` as messages and log lines may show it: without its password."""
    return re.sub(r"(//[^:/@]+):[^@/]*@", r"\1:***@", url)


def open_store(
    url: str,
    *,
    pool_size: int = 4,
    migrate: bool = True,
    ensure_schema: bool = True,
    one_shot: bool = False,
) -> PostgresRunStore | SQLiteRunStore:
    """A connected store for `url`, migrated if `migrate` (else SchemaMissing if behind).

    With `ensure_schema=False` the schema is neither checked nor migrated (what `steptrail
    migrate` wants: it migrates itself). A SQLite file that did not exist before and could
    not be opened with its schema is removed again, so a failed open leaves nothing behind.
    With `one_shot` (a command that ends when its work is done) a PostgreSQL store keeps one
    connection instead of a pool of `pool_size` (ADR 0056).

    Raises:
        ValueError: the URL is not one steptrail understands.
        StoreUnavailable: the database cannot be reached.
        SchemaMissing: the schema is behind and `migrate` is false.
    """
    if not url.strip():
        raise ValueError("the database URL is empty: use sqlite:///path.db or postgresql://host/db")
    scheme = url.split(":", 1)[0].lower()
    store: PostgresRunStore | SQLiteRunStore
    created: Path | None = None
    if scheme in ("postgresql", "postgres"):
        from steptrail.infrastructure.postgres import PostgresRunStore

        store = PostgresRunStore(url, pool_size=pool_size, one_shot=one_shot)
    elif scheme == "sqlite":
        from steptrail.infrastructure.sqlite import SQLiteRunStore, target_from_url

        path = target_from_url(url).path
        created = path if path is not None and not path.exists() else None
        if created is not None and ensure_schema and not migrate:
            # Nothing may create the schema here, so nothing creates the file either.
            raise SchemaMissing(
                f"no steptrail schema at {shown_url(url)} (no such file); run `steptrail migrate`"
            )
        try:
            store = SQLiteRunStore(url, pool_size=pool_size)
        except BaseException:
            _remove(created)
            raise
    else:
        raise ValueError(
            f"unsupported database URL {url!r}: use sqlite:///path.db or postgresql://host/db"
        )
    try:
        if ensure_schema:
            _ensure_schema(store, url, migrate=migrate)
    except BaseException:
        store.close()
        _remove(created)
        raise
    return store


def _remove(created: Path | None) -> None:
    """Remove a SQLite database file this open created, with its companions."""
    if created is None:
        return
    for suffix in ("", "-wal", "-shm", "-journal", ".writer-lock"):
        with suppress(OSError):
            Path(f"{created}{suffix}").unlink()


def _ensure_schema(store: PostgresRunStore | SQLiteRunStore, url: str, *, migrate: bool) -> None:
    # Checking is one cheap read; only when something is missing do we take the migration
    # lock (an advisory lock on PostgreSQL, the write lock on SQLite), and the migrator
    # re-checks under it, so a fleet of workers starting together migrates exactly once.
    pending = store.pending_migrations()
    if not pending:
        return
    if not migrate:
        if len(pending) >= len(migrations(store.backend)):
            raise SchemaMissing(f"no steptrail schema at {shown_url(url)}; run `steptrail migrate`")
        raise SchemaMissing(
            f"the steptrail schema at {shown_url(url)} is {len(pending)} migration(s) behind "
            "this steptrail; run `steptrail migrate`"
        )
    applied = store.migrate()
    if applied:  # one line, naming the database: a schema never appears unannounced
        steptrail_logger().info(
            "schema_migrated",
            database=shown_url(url),
            applied=len(applied),
            first=applied[0],
            last=applied[-1],
        )


__all__ = ["ReadOnlyStore", "SchemaMissing", "StoreUnavailable", "open_store"]
