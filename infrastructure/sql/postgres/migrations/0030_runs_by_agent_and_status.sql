-- `steptrail runs --agent X --status S` walks one index backwards from the page's key and
-- stops after the page (ADR 0064). It walked the status's slice of the (status, created_at,
-- run_id) index and dropped every run of another agent: a rare agent in a long history of
-- one status cost that whole history. The (status, agent, created_at) index of migration
-- 0001 gains run_id, the listing's last key, so the walk needs no sort. SQLite's index of
-- the same columns already ends with run_id (the table is WITHOUT ROWID).
DROP INDEX IF EXISTS steptrail_runs_status_idx;
CREATE INDEX steptrail_runs_status_idx ON steptrail_runs (status, agent, created_at, run_id);
