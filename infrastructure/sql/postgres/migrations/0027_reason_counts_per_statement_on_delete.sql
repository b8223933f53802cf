-- Deleting summaries counts their reasons down once per statement, not once per row (ADR
-- 0059).
--
-- Migration 0016's row trigger updated the count row of the deleted summary's (status,
-- reason) once per deleted row. In one transaction every update of the same row leaves a
-- dead version that no one can prune before the commit, and each next update walks past all
-- of them: deleting n summaries of one reason cost O(n^2). Measured: 5,000 summaries 0.7 s,
-- 10,000 2.0 s, 20,000 7.5 s, 40,000 31 s; `rebuild reporting` on a million runs (963,000
-- completed) did not finish its first statement in 15 minutes. Purge batches paid the same
-- per batch. A statement-level trigger sees every deleted row at once (its transition table)
-- and updates each count row once.
--
-- Inserts and updates keep the row trigger: the projector writes its summaries one
-- statement per row, where a statement trigger would cost more per row and save nothing.
-- Their per-transaction chains are bounded by a batch (a projector batch, a rebuild range).

CREATE OR REPLACE FUNCTION steptrail_uncount_reasons() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE steptrail_view_reason_counts AS c SET count = c.count - gone.n
    FROM (
        SELECT status, reason, count(*) AS n FROM steptrail_deleted_summaries
        WHERE reason IS NOT NULL GROUP BY status, reason
    ) AS gone
    WHERE c.status = gone.status AND c.reason = gone.reason;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS steptrail_reason_counts_insert_delete ON steptrail_view_run_summaries;
DROP TRIGGER IF EXISTS steptrail_reason_counts_insert ON steptrail_view_run_summaries;
CREATE TRIGGER steptrail_reason_counts_insert
AFTER INSERT ON steptrail_view_run_summaries
FOR EACH ROW EXECUTE FUNCTION steptrail_count_reasons();

DROP TRIGGER IF EXISTS steptrail_reason_counts_delete ON steptrail_view_run_summaries;
CREATE TRIGGER steptrail_reason_counts_delete
AFTER DELETE ON steptrail_view_run_summaries
REFERENCING OLD TABLE AS steptrail_deleted_summaries
FOR EACH STATEMENT EXECUTE FUNCTION steptrail_uncount_reasons();
