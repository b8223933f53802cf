-- The claim index is per agent and its key is the claim's ORDER BY (ADR 0037): a worker
-- serving one agent walks only that agent's queued runs, in claim order, and stops after
-- its batch; a backlog of another agent's runs costs it nothing. The queries name their
-- index (INDEXED BY): SQLite gathers no statistics on its own, and planning without them it
-- could rather read every queued run and sort. It replaces the global claimable index.
CREATE INDEX IF NOT EXISTS steptrail_runs_queued_idx
    ON steptrail_runs (agent, available_at, run_id) WHERE status = 'queued';
DROP INDEX IF EXISTS steptrail_runs_claimable_idx;
