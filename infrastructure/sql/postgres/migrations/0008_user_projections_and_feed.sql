-- User projections and the event feed (ADRs 0028, 0029).
--
-- A projection whose fold raised: where it stopped and why. Kept apart from the tracking row
-- so that a failure never touches the position (the failed batch rolled back) and the row is
-- deleted by the first batch that commits again.
CREATE TABLE steptrail_projection_failures (
    projection text PRIMARY KEY,
    position_tx bigint NOT NULL,
    position bigint NOT NULL,
    run_id uuid,
    topic text,
    error text NOT NULL,
    failed_at timestamptz NOT NULL,
    attempts integer NOT NULL
);

-- Where purged events stood in the log, in the log's own order (inserting transaction, id):
-- the feed reports these positions as purged instead of passing them silently. Positions,
-- run and version only; no content.
CREATE TABLE steptrail_purged_events (
    position_tx bigint NOT NULL,
    position bigint NOT NULL,
    run_id uuid NOT NULL,
    version bigint NOT NULL,
    purged_at timestamptz NOT NULL,
    PRIMARY KEY (position_tx, position)
);
