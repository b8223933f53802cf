-- PostgreSQL only (ADR 0064: `runs --agent X --status S` walks the (status, agent,
-- created_at, run_id) index). SQLite's steptrail_runs_status_idx (status, agent, created_at)
-- already ends with run_id, the key of the WITHOUT ROWID table. Kept so both backends
-- number their schema versions alike.
SELECT 1;
