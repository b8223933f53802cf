-- Hardening under faults (ADR 0016, ADR 0017). SQLite reads its clock inside the write lock
-- and its notification ids commit in order, so only the reporting runner's failure record is
-- new here: how many batches failed in a row, and the last error, for `steptrail stats`.
ALTER TABLE steptrail_tracking ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steptrail_tracking ADD COLUMN last_error TEXT;
