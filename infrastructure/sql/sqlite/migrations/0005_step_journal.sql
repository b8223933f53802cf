-- The step journal (ADR 0013): each recorded step's verbatim outcome, beside the log, so a
-- later segment of the run can hand it back instead of running the step again. Resumable-
-- state-grade content: written in the same transaction as the step's StepRecorded, deleted in
-- the transaction that settles the run, and by purge with the run. `position` is which step
-- call of the agent's execution the entry answers; `outcome` is JSON (a value or an error).
-- No foreign key to the run index: journal rows are only written by an append whose events
-- already prove the run exists (the events' key is the fence), and a key check per row would
-- cost the hot path a lookup for nothing.
CREATE TABLE steptrail_journal (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    position INTEGER NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    outcome BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
