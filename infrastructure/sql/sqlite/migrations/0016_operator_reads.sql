-- Operator reads cost what they return, not what the history holds (ADR 0042).
--
-- 1. Ended runs by reason, kept as counts: `stats` read them with a GROUP BY over every
-- summary. Triggers on the summaries keep the counts whatever writes them (the projector's
-- upsert, purge's delete, a rebuild's clear), one row per (status, reason). Each trigger
-- body is one statement ending its line with "END;" (migrations split at a semicolon that
-- ends a line).
CREATE TABLE IF NOT EXISTS steptrail_view_reason_counts (
    status TEXT NOT NULL,
    reason TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (status, reason)
) WITHOUT ROWID;

DELETE FROM steptrail_view_reason_counts;
INSERT INTO steptrail_view_reason_counts (status, reason, count)
SELECT status, reason, count(*) FROM steptrail_view_run_summaries
WHERE reason IS NOT NULL GROUP BY status, reason;

CREATE TRIGGER steptrail_reason_counts_insert
AFTER INSERT ON steptrail_view_run_summaries WHEN new.reason IS NOT NULL
BEGIN
    INSERT INTO steptrail_view_reason_counts (status, reason, count)
    VALUES (new.status, new.reason, 1)
    ON CONFLICT (status, reason) DO UPDATE SET count = count + 1; END;

CREATE TRIGGER steptrail_reason_counts_delete
AFTER DELETE ON steptrail_view_run_summaries WHEN old.reason IS NOT NULL
BEGIN
    UPDATE steptrail_view_reason_counts SET count = count - 1
    WHERE status = old.status AND reason = old.reason; END;

CREATE TRIGGER steptrail_reason_counts_update_old
AFTER UPDATE OF status, reason ON steptrail_view_run_summaries
WHEN old.reason IS NOT NULL AND (old.status IS NOT new.status OR old.reason IS NOT new.reason)
BEGIN
    UPDATE steptrail_view_reason_counts SET count = count - 1
    WHERE status = old.status AND reason = old.reason; END;

CREATE TRIGGER steptrail_reason_counts_update_new
AFTER UPDATE OF status, reason ON steptrail_view_run_summaries
WHEN new.reason IS NOT NULL AND (old.status IS NOT new.status OR old.reason IS NOT new.reason)
BEGIN
    INSERT INTO steptrail_view_reason_counts (status, reason, count)
    VALUES (new.status, new.reason, 1)
    ON CONFLICT (status, reason) DO UPDATE SET count = count + 1; END;

-- 2. `runs --status S` walks steptrail_runs_status_created_idx, which migration 0017 creates
-- for purge (ADR 0041); nothing to add here.

-- 3. The oldest queued run (`stats`, metrics): min(updated_at) read every queued run.
CREATE INDEX IF NOT EXISTS steptrail_runs_queued_since_idx
    ON steptrail_runs (updated_at) WHERE status = 'queued';
