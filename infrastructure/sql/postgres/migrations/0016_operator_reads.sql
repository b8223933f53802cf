-- Operator reads cost what they return, not what the history holds (ADR 0042).
--
-- 1. Ended runs by reason, kept as counts: `stats` read them with a GROUP BY over every
-- summary. A trigger on the summaries keeps the counts whatever writes them (the projector's
-- upsert, purge's delete, a rebuild's clear), one row per (status, reason). Every writer of
-- the summaries holds the reporting runner's tracking row, so the counter rows see one
-- writer at a time.
CREATE TABLE IF NOT EXISTS steptrail_view_reason_counts (
    status text NOT NULL,
    reason text NOT NULL,
    count bigint NOT NULL,
    PRIMARY KEY (status, reason)
);

DELETE FROM steptrail_view_reason_counts;
INSERT INTO steptrail_view_reason_counts (status, reason, count)
SELECT status, reason, count(*) FROM steptrail_view_run_summaries
WHERE reason IS NOT NULL GROUP BY status, reason;

CREATE OR REPLACE FUNCTION steptrail_count_reasons() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        IF OLD.reason IS NOT NULL THEN
            UPDATE steptrail_view_reason_counts SET count = count - 1
            WHERE status = OLD.status AND reason = OLD.reason;
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        IF NEW.reason IS NOT NULL THEN
            INSERT INTO steptrail_view_reason_counts (status, reason, count)
            VALUES (NEW.status, NEW.reason, 1)
            ON CONFLICT (status, reason)
            DO UPDATE SET count = steptrail_view_reason_counts.count + 1;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS steptrail_reason_counts_insert_delete ON steptrail_view_run_summaries;
CREATE TRIGGER steptrail_reason_counts_insert_delete
AFTER INSERT OR DELETE ON steptrail_view_run_summaries
FOR EACH ROW EXECUTE FUNCTION steptrail_count_reasons();

DROP TRIGGER IF EXISTS steptrail_reason_counts_update ON steptrail_view_run_summaries;
CREATE TRIGGER steptrail_reason_counts_update
AFTER UPDATE OF status, reason ON steptrail_view_run_summaries
FOR EACH ROW
WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.reason IS DISTINCT FROM NEW.reason)
EXECUTE FUNCTION steptrail_count_reasons();

-- 2. `runs --status S` walks steptrail_runs_status_created_idx (status, created_at, run_id),
-- which migration 0017 creates for purge (ADR 0041); nothing to add here.

-- 3. The oldest queued run (`stats`, metrics): min(updated_at) read every queued run; the
-- query now walks this index for its first entry (steptrail_oldest_queued).
CREATE INDEX IF NOT EXISTS steptrail_runs_queued_since_idx
    ON steptrail_runs (updated_at) WHERE status = 'queued';

CREATE OR REPLACE FUNCTION steptrail_oldest_queued() RETURNS timestamptz
LANGUAGE sql STABLE
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
    SELECT updated_at FROM steptrail_runs WHERE status = 'queued'
    ORDER BY updated_at LIMIT 1
$$;
