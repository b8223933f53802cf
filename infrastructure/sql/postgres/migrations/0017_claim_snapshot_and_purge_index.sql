-- Two maintenance fixes (ADR 0040, ADR 0041).
--
-- 1. The claim in one snapshot. The claim statement called steptrail_claimable (migration
-- 0010), a VOLATILE function, to pick and lock its runs: a VOLATILE function's query takes a
-- snapshot of its own, newer than the calling statement's. A run enqueued between the two
-- snapshots was picked and locked, its Claimed event inserted, but the calling statement's
-- UPDATE could not see its row (not in the older snapshot) and left it queued: the index fell
-- behind the log, and the next claim of that run failed on the log's key (a VersionConflict
-- for a worker that did nothing wrong). Concurrent enqueues and claims (and a range rebuild,
-- which rewrites rows) made it frequent. steptrail_claim does the whole claim - pick and lock,
-- insert Claimed, update the rows, read the saved requests - as one statement inside the
-- function, so every part of it sees the same snapshot; the planner settings of 0010 apply to
-- it all (ADR 0037: the walk of steptrail_runs_queued_idx stops after the batch).
CREATE FUNCTION steptrail_claim(
    p_agents text[], p_limit integer, p_topic text, p_state bytea,
    p_holder text, p_lease_ms bigint
)
RETURNS TABLE (run steptrail_runs, request bytea)
LANGUAGE plpgsql VOLATILE ROWS 16
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH clock AS MATERIALIZED (
        SELECT clock_timestamp() AS at
    ), picked AS (
        SELECT p.run_id, p.version FROM unnest(p_agents) AS a(agent)
        CROSS JOIN LATERAL (
            SELECT r.run_id, r.version, r.available_at FROM steptrail_runs AS r
            WHERE r.status = 'queued' AND r.agent = a.agent AND r.available_at <= now()
            ORDER BY r.available_at, r.run_id
            LIMIT p_limit
            FOR UPDATE OF r SKIP LOCKED
        ) AS p
        ORDER BY p.available_at, p.run_id
        LIMIT p_limit
    ), claimed_event AS (
        INSERT INTO steptrail_events (originator_id, originator_version, topic, state, recorded_at)
        SELECT picked.run_id, picked.version + 1, p_topic, p_state, clock.at FROM picked, clock
        RETURNING originator_id, originator_version, recorded_at
    ), claimed AS (
        UPDATE steptrail_runs AS r SET
            status = 'running',
            version = e.originator_version,
            segment = 'worker',
            holder = p_holder,
            lease_ms = p_lease_ms,
            claim_version = e.originator_version,
            lease_expires_at = e.recorded_at + p_lease_ms * interval '1 millisecond',
            available_at = NULL,
            updated_at = e.recorded_at
        FROM claimed_event AS e
        WHERE r.run_id = e.originator_id
        RETURNING r.*
    )
    SELECT ROW(c.*)::steptrail_runs, s.body
    FROM claimed AS c
    LEFT JOIN steptrail_saved AS s ON s.run_id = c.run_id AND s.kind = 'request'
    ORDER BY c.run_id;
END
$$;

-- 2. Purge batches in O(batch) (ADR 0041): a purge takes the oldest runs of one status at a
-- time along this index and stops after the batch, however many runs the database holds
-- (steptrail_runs_status_idx has the agent between status and created_at, so it could only
-- read every run of the status and sort them).
CREATE INDEX IF NOT EXISTS steptrail_runs_status_created_idx
    ON steptrail_runs (status, created_at, run_id);
