-- Same views as PostgreSQL; ids as hex text, instants as integer microseconds.
CREATE TABLE steptrail_tracking (
    projection TEXT PRIMARY KEY,
    position INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE steptrail_view_run_summaries (
    run_id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    state TEXT NOT NULL,
    steps INTEGER NOT NULL,
    step_ms INTEGER NOT NULL,
    suspensions INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    ended_at INTEGER
) WITHOUT ROWID;
CREATE INDEX steptrail_view_run_summaries_status_idx
    ON steptrail_view_run_summaries (status, reason);

CREATE TABLE steptrail_view_status_counts (
    agent TEXT NOT NULL,
    status TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (agent, status)
) WITHOUT ROWID;

CREATE TABLE steptrail_view_dead_letters (
    run_id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    reason TEXT NOT NULL,
    cause TEXT NOT NULL,
    failure_class TEXT,
    error_type TEXT,
    requeue_count INTEGER NOT NULL,
    dead_lettered_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX steptrail_view_dead_letters_when_idx
    ON steptrail_view_dead_letters (dead_lettered_at DESC);
