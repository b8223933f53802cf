-- The step journal (ADR 0013): each recorded step's verbatim outcome, beside the log, so a
-- later segment of the run can hand it back instead of running the step again. Resumable-
-- state-grade content: written in the same transaction as the step's StepRecorded, deleted in
-- the transaction that settles the run, and by purge with the run. `position` is which step
-- call of the agent's execution the entry answers; `outcome` is JSON (a value or an error).
CREATE TABLE steptrail_journal (
    run_id TEXT NOT NULL REFERENCES steptrail_runs (run_id) DEFERRABLE INITIALLY DEFERRED,
    seq INTEGER NOT NULL,
    position INTEGER NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    outcome BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
