-- Waits that end by time or by a signal (ADR 0068, 0073): the claim index covers every run
-- the claim may take, queued or waiting with a deadline (`available_at` set); the inbox of
-- signals sits beside the log. The append's and the claim's rules are queries (update_run,
-- claim, claim_rows).
CREATE INDEX IF NOT EXISTS steptrail_runs_available_idx
    ON steptrail_runs (agent, available_at, run_id) WHERE available_at IS NOT NULL;
DROP INDEX IF EXISTS steptrail_runs_queued_idx;

CREATE TABLE IF NOT EXISTS steptrail_signals (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    name TEXT NOT NULL,
    payload BLOB NOT NULL,
    sent_by TEXT NOT NULL,
    sent_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
