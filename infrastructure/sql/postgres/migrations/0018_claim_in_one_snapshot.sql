-- The whole claim is one statement inside one function (ADR 0048).
--
-- Until now the claim statement called steptrail_claimable (migration 0010) to pick and lock
-- its runs, then inserted the Claimed events and updated the rows itself. A VOLATILE PL/pgSQL
-- function takes a new snapshot for each of its statements, so the lock pass saw runs that
-- committed after the calling statement began, and the calling statement's UPDATE, which
-- reads with the older snapshot, did not see them: a run enqueued in that window got its
-- Claimed event but kept its row queued at version 1. Every later claim of it then broke
-- on the event's primary key, and with it every worker that served its agent.
--
-- Here the pick, the lock, the event and the row update run in one statement, so they share
-- one snapshot: a row locked is a row the update sees. The planner settings are those of
-- migration 0010 (ADR 0037) and cover the whole claim; the lock pass stays an ordered walk
-- of steptrail_runs_queued_idx, the rows are updated through the primary key, and the
-- one sort left merges at most agents x p_limit rows.
CREATE FUNCTION steptrail_claim(
    p_agents text[], p_limit integer, p_topic text, p_state bytea, p_holder text,
    p_lease_ms bigint
)
RETURNS TABLE (run steptrail_runs, request bytea)
LANGUAGE plpgsql VOLATILE ROWS 16
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
BEGIN
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
DROP FUNCTION IF EXISTS steptrail_claimable(text[], integer);
