-- Child runs (ADR 0075): a run's parent is a column of the run index, written once when the
-- child is enqueued (it never changes), so "the children of P" is an index read for show,
-- cancel and purge. Only children have one: the index is partial. Runs stored before have no
-- parent (a nullable column without a default is added without rewriting the table).
ALTER TABLE steptrail_runs ADD COLUMN IF NOT EXISTS parent_id uuid;
CREATE INDEX IF NOT EXISTS steptrail_runs_parent_idx
    ON steptrail_runs (parent_id) WHERE parent_id IS NOT NULL;
