-- Purge batches in O(batch) (ADR 0041): a purge takes the oldest runs of one status at a time
-- along this index and stops after the batch, however many runs the database holds
-- (steptrail_runs_status_idx has the agent between status and created_at, so it could only
-- read every run of the status and sort them). The table is WITHOUT ROWID: run_id, its key,
-- is in every index entry after the indexed columns, so the walk is in (created_at, run_id)
-- order. (The claim's part of this migration is PostgreSQL's: SQLite claims under its write
-- lock, in one snapshot already.)
CREATE INDEX IF NOT EXISTS steptrail_runs_status_created_idx
    ON steptrail_runs (status, created_at);
