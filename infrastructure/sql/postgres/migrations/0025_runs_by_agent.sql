-- `steptrail runs --agent X` (`Runtime.runs(agent=...)`) without a status walks this index
-- backwards from the page's key and stops after the page (ADR 0056). Along the creation
-- index it read every run newer than the page's runs of that agent and kept only those: a
-- rare agent in a long history cost the whole history. Its columns never change once a run
-- is created, so it keeps no update from being HOT; an update that is not HOT (one that
-- changes the status or the lease, both indexed) adds an entry here as in every index.
CREATE INDEX IF NOT EXISTS steptrail_runs_agent_created_idx
    ON steptrail_runs (agent, created_at, run_id);
