-- `steptrail runs --agent X` without a status walks this index backwards from the page's key
-- and stops after the page (ADR 0056); along the creation index a rare agent in a long
-- history cost the whole history. The table is WITHOUT ROWID: run_id, its key, is in every
-- index entry after the indexed columns, so the walk is in (created_at, run_id) order.
CREATE INDEX IF NOT EXISTS steptrail_runs_agent_created_idx
    ON steptrail_runs (agent, created_at);
