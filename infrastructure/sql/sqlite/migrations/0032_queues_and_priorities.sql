-- Named queues and priorities (ADR 0077, on ADR 0068 section 3): every run has a queue and a
-- priority, columns of the run index (existing runs: the default queue, priority 0). The
-- claim index leads with them after the agent, so the claim walks each (agent, queue) by
-- priority level, highest first, and each level from the run that became claimable first;
-- a level's runs whose time has not come sit after `now` in it and cost the claim nothing.
-- The old index is dropped in the same migration: the claim names the new one (INDEXED BY).
ALTER TABLE steptrail_runs ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';
ALTER TABLE steptrail_runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS steptrail_runs_claim_idx
    ON steptrail_runs (agent, queue, priority DESC, available_at, run_id)
    WHERE available_at IS NOT NULL;
DROP INDEX IF EXISTS steptrail_runs_available_idx;
