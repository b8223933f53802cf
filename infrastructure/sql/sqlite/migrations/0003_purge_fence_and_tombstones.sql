-- SQLite cannot add a constraint to a table: the log is copied into a new table with the
-- foreign key (deferred, as on PostgreSQL; enforced because every write connection turns
-- PRAGMA foreign_keys on). Copying keeps every notification id, and sqlite_sequence follows
-- the rename, so ids are never reused.
CREATE TABLE steptrail_events_new (
    notification_id INTEGER PRIMARY KEY AUTOINCREMENT,
    originator_id TEXT NOT NULL
        REFERENCES steptrail_runs (run_id) DEFERRABLE INITIALLY DEFERRED,
    originator_version INTEGER NOT NULL,
    topic TEXT NOT NULL,
    state BLOB NOT NULL,
    recorded_at INTEGER NOT NULL,
    UNIQUE (originator_id, originator_version)
);
INSERT INTO steptrail_events_new
    (notification_id, originator_id, originator_version, topic, state, recorded_at)
SELECT notification_id, originator_id, originator_version, topic, state, recorded_at
FROM steptrail_events;
DELETE FROM sqlite_sequence WHERE name = 'steptrail_events_new';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'steptrail_events_new', seq FROM sqlite_sequence WHERE name = 'steptrail_events';
DROP TABLE steptrail_events;
ALTER TABLE steptrail_events_new RENAME TO steptrail_events;

CREATE TABLE steptrail_tombstones (
    run_id TEXT PRIMARY KEY,
    category TEXT NOT NULL,
    purged_at INTEGER NOT NULL
) WITHOUT ROWID;
