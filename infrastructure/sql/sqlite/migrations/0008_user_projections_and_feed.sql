-- User projections and the event feed (ADRs 0028, 0029). Same tables as PostgreSQL.
--
-- A projection whose fold raised: where it stopped and why. Kept apart from the tracking row
-- so that a failure never touches the position (the failed batch rolled back) and the row is
-- deleted by the first batch that commits again.
CREATE TABLE steptrail_projection_failures (
    projection TEXT PRIMARY KEY,
    position_tx INTEGER NOT NULL,
    position INTEGER NOT NULL,
    run_id TEXT,
    topic TEXT,
    error TEXT NOT NULL,
    failed_at INTEGER NOT NULL,
    attempts INTEGER NOT NULL
) WITHOUT ROWID;

-- Where purged events stood in the log: the feed reports these positions as purged instead
-- of passing them silently. Positions, run and version only; no content.
CREATE TABLE steptrail_purged_events (
    position_tx INTEGER NOT NULL,
    position INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    purged_at INTEGER NOT NULL,
    PRIMARY KEY (position_tx, position)
) WITHOUT ROWID;
