-- SQLite differs from PostgreSQL in three ways, on purpose:
-- * ids are 32-character hex text (what the eventsourcing SQLite recorder writes);
-- * instants are integer microseconds since the epoch, so folds compare exactly;
-- * the notification id is an AUTOINCREMENT key, which SQLite never reuses, even after a
--   purge deletes the newest rows (a plain rowid could be reused and a projection skip it).
CREATE TABLE steptrail_events (
    notification_id INTEGER PRIMARY KEY AUTOINCREMENT,
    originator_id TEXT NOT NULL,
    originator_version INTEGER NOT NULL,
    topic TEXT NOT NULL,
    state BLOB NOT NULL,
    recorded_at INTEGER NOT NULL,
    UNIQUE (originator_id, originator_version)
);

CREATE TABLE steptrail_runs (
    run_id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    status TEXT NOT NULL,
    version INTEGER NOT NULL,
    segment TEXT,
    holder TEXT,
    lease_ms INTEGER,
    claim_version INTEGER,
    requeue_count INTEGER NOT NULL DEFAULT 0,
    reason TEXT,
    idempotency_key TEXT,
    doc TEXT NOT NULL,
    lease_expires_at INTEGER,
    available_at INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX steptrail_runs_claimable_idx
    ON steptrail_runs (available_at, run_id) WHERE status = 'queued';
CREATE INDEX steptrail_runs_lease_idx
    ON steptrail_runs (lease_expires_at) WHERE status = 'running';
CREATE UNIQUE INDEX steptrail_runs_idempotency_key_idx
    ON steptrail_runs (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX steptrail_runs_status_idx ON steptrail_runs (status, agent, created_at);
CREATE INDEX steptrail_runs_created_idx ON steptrail_runs (created_at);

CREATE TABLE steptrail_saved (
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (run_id, kind)
) WITHOUT ROWID;
