-- Rate limits (ADR 0080): each row a limit defined in code (stored by every worker at its
-- start) and the instant a provider's Retry-After blocks it until; each grant a step that
-- was let through, with its estimated (later: reported) tokens. Instants are microseconds
-- since the Unix epoch by the store's clock, as everywhere in this store.
CREATE TABLE IF NOT EXISTS steptrail_rate_limits (
    name TEXT PRIMARY KEY,
    requests INTEGER,
    tokens INTEGER,
    per_ms INTEGER NOT NULL,
    margin_ms INTEGER NOT NULL,
    blocked_until INTEGER,
    updated_at INTEGER NOT NULL,
    updated_by TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS steptrail_rate_grants (
    id INTEGER PRIMARY KEY,
    limit_name TEXT NOT NULL,
    granted_at INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    run_id TEXT NOT NULL
);

CREATE INDEX IF NOT EXISTS steptrail_rate_grants_window
    ON steptrail_rate_grants (limit_name, granted_at);
