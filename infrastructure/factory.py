"""Open the store a database URL names, with its schema in place."""

from __future__ import annotations

from steptrail.domain.errors import StoreUnavailable
from steptrail.infrastructure.postgres import PostgresRunStore
from steptrail.infrastructure.sqlite import SQLiteRunStore


class SchemaMissing(RuntimeError):
    """The database has no steptrail schema (or an old one) and auto-migration is off."""


def open_store(
    url: str, *, pool_size: int = 4, migrate: bool = True
) -> PostgresRunStore | SQLiteRunStore:
    """A connected store for `url`, migrated if `migrate` (else SchemaMissing if behind).

    Raises:
        ValueError: the URL is not one steptrail understands.
        StoreUnavailable: the database cannot be reached.
        SchemaMissing: the schema is behind and `migrate` is false.
    """
    scheme = url.split(":", 1)[0].lower()
    store: PostgresRunStore | SQLiteRunStore
    if scheme in ("postgresql", "postgres"):
        store = PostgresRunStore(url, pool_size=pool_size)
    elif scheme == "sqlite":
        store = SQLiteRunStore(url, pool_size=pool_size)
    else:
        raise ValueError(
            f"unsupported database URL {url!r}: use sqlite:///path.db or postgresql://host/db"
        )
    try:
        _ensure_schema(store, migrate=migrate)
    except BaseException:
        store.close()
        raise
    return store


def _ensure_schema(store: PostgresRunStore | SQLiteRunStore, *, migrate: bool) -> None:
    # Checking is one cheap read; only when something is missing do we take the migration
    # lock (an advisory lock on PostgreSQL, the write lock on SQLite), and the migrator
    # re-checks under it, so a fleet of workers starting together migrates exactly once.
    pending = store.pending_migrations()
    if not pending:
        return
    if not migrate:
        raise SchemaMissing(
            f"the database schema is missing {len(pending)} migration(s); run `steptrail migrate`"
        )
    store.migrate()


__all__ = ["SchemaMissing", "StoreUnavailable", "open_store"]
