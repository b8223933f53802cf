-- The claim takes its tables in the writers' order: the run index, then the log (ADR 0054).
--
-- The reaper locks steptrail_runs and then steptrail_events IN SHARE MODE (ADR 0016), and
-- every writer holds ROW EXCLUSIVE on both while it writes. steptrail_append and the rebuild
-- take the run index first; the claim of migration 0018 did not: its lock pass (FOR UPDATE)
-- holds only ROW SHARE on steptrail_runs, which SHARE does not block, then it inserts the
-- Claimed events (ROW EXCLUSIVE on the log) and only then updates the rows. A reaper that
-- got SHARE on the run index in between waited for the log behind the claim, and the claim
-- waited for the run index behind the reaper: a deadlock, seen once in the chaos suite
-- (PostgreSQL broke it after deadlock_timeout by aborting one side). Locking the run index
-- first puts the claim in the reaper's queue before it holds anything the reaper needs.

CREATE OR REPLACE FUNCTION steptrail_claim(
    p_agents text[], p_limit integer, p_topic text, p_state bytea, p_holder text,
    p_lease_ms bigint
)
RETURNS TABLE (run steptrail_runs, request bytea)
LANGUAGE plpgsql VOLATILE ROWS 16
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
BEGIN
    -- The run index before the log, as every writer takes them (see above).
    LOCK TABLE steptrail_runs IN ROW EXCLUSIVE MODE;
    RETURN QUERY
    WITH clock AS MATERIALIZED (
        SELECT clock_timestamp() AS at
    ), picked AS MATERIALIZED (
        SELECT p.run_id, p.version, p.available_at
        FROM unnest(p_agents) AS a(agent)
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
    -- The request is read here too, in the same snapshot: a run enqueued after the calling
    -- statement began has its saved request visible only to this statement.
    SELECT c::steptrail_runs, s.body
    FROM claimed AS c
    LEFT JOIN steptrail_saved AS s ON s.run_id = c.run_id AND s.kind = 'request';
END
$$;

-- Nothing calls the split claim any more; it goes, so nothing can.
