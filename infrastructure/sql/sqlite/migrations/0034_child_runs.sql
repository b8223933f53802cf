-- Child runs (ADR 0075): a run's parent is a column of the run index, written once when the
-- child is enqueued (it never changes), so "the children of P" is an index read for show,
-- cancel and purge. Only children have one: the index is partial. Runs stored before have no
-- parent.
ALTER TABLE steptrail_runs ADD COLUMN parent_id TEXT;
CREATE INDEX IF NOT EXISTS steptrail_runs_parent_idx
    ON steptrail_runs (parent_id) WHERE parent_id IS NOT NULL;
