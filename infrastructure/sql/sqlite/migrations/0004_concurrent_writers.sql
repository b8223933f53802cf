-- SQLite keeps one writer at a time, so notification ids commit in order and no append
-- function is needed; only the tracking position gains the (unused, always 0) transaction
-- part that PostgreSQL's readers need, so both backends share one tracking shape.
ALTER TABLE steptrail_tracking ADD COLUMN position_tx INTEGER NOT NULL DEFAULT 0;
