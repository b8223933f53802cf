-- Schedules (ADR 0076): each row a cron expression that enqueues a run of its agent at every
-- tick, with the next tick nobody has fired yet. Instants are microseconds since the Unix
-- epoch by the store's clock, as everywhere in this store.
CREATE TABLE IF NOT EXISTS steptrail_schedules (
    name TEXT PRIMARY KEY,
    cron TEXT NOT NULL,
    agent TEXT NOT NULL,
    request TEXT NOT NULL,
    missed TEXT NOT NULL,
    grace_ms INTEGER NOT NULL,
    paused INTEGER NOT NULL DEFAULT 0,
    next_tick_at INTEGER NOT NULL,
    last_tick_at INTEGER,
    last_run_id TEXT,
    updated_at INTEGER NOT NULL,
    updated_by TEXT NOT NULL
) WITHOUT ROWID;
