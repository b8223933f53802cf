-- Named queues and priorities (ADR 0077, on ADR 0068 section 3).
--
-- 1. Every run has a queue and a priority, columns of the run index. Existing runs get the
--    default queue and priority 0: a constant default is stored once in the catalogue, so
--    adding the columns rewrites no row.
-- 2. The claim index leads with them after the agent: (agent, queue, priority DESC,
--    available_at, run_id) over every row the claim may take. Built inside the migration's
--    transaction like every index before it (CONCURRENTLY cannot run in one; the migrator
--    holds its advisory lock and the table's lock only for the build).
-- 3. steptrail_claim takes the queues to claim from (NULL: every queue) and walks, per
--    (agent, queue), the priority levels highest first (one descent of the index each) and
--    each level's runs from the one that became claimable first: a level's runs whose time
--    has not come (a sleeper, a backoff) sit after now() in it and are never read.
-- 4. steptrail_append_claim passes a settle's claim the worker's queues.
-- steptrail_append is unchanged: no append changes a run's queue or priority but
-- PriorityChanged, whose store writes the priority in the append's transaction.
ALTER TABLE steptrail_runs ADD COLUMN IF NOT EXISTS queue text NOT NULL DEFAULT 'default';
ALTER TABLE steptrail_runs ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS steptrail_runs_claim_idx
    ON steptrail_runs (agent, queue, priority DESC, available_at, run_id)
    WHERE available_at IS NOT NULL;
DROP INDEX IF EXISTS steptrail_runs_available_idx;

DROP FUNCTION IF EXISTS steptrail_append_claim(
    uuid, bigint, bigint[], text[], bytea[], text, text, bigint, text, text, bigint, bigint,
    integer, text, text, jsonb, bigint, bytea, boolean, boolean, bigint[], integer[], text[],
    text[], text[], bytea[], text[], integer, text, bytea, text, bigint
);
DROP FUNCTION IF EXISTS steptrail_claim(text[], integer, text, bytea, text, bigint);

CREATE FUNCTION steptrail_claim(
    p_agents text[], p_limit integer, p_topic text, p_state bytea, p_holder text,
    p_lease_ms bigint, p_queues text[]
)
RETURNS TABLE (run steptrail_runs, request bytea)
LANGUAGE plpgsql VOLATILE ROWS 16
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
BEGIN
    -- The run index before the log, as every writer takes them (ADR 0054).
    LOCK TABLE steptrail_runs IN ROW EXCLUSIVE MODE;
    RETURN QUERY
    WITH RECURSIVE clock AS MATERIALIZED (
        SELECT clock_timestamp() AS at
    ), found (agent, queue) AS (
        -- Every queue an agent has claimable runs in (p_queues NULL): a loose walk of the
        -- claim index, one descent per queue.
        SELECT a.agent, (
            SELECT r.queue FROM steptrail_runs AS r
            WHERE r.agent = a.agent AND r.available_at IS NOT NULL
            ORDER BY r.queue LIMIT 1
        ) FROM unnest(p_agents) AS a(agent) WHERE p_queues IS NULL
        UNION ALL
        SELECT f.agent, (
            SELECT r.queue FROM steptrail_runs AS r
            WHERE r.agent = f.agent AND r.queue > f.queue AND r.available_at IS NOT NULL
            ORDER BY r.queue LIMIT 1
        ) FROM found AS f WHERE f.queue IS NOT NULL
    ), pairs AS (
        SELECT f.agent, f.queue FROM found AS f WHERE f.queue IS NOT NULL
        UNION ALL
        SELECT a.agent, q.queue FROM unnest(p_agents) AS a(agent) CROSS JOIN unnest(p_queues) AS q(queue)
    ), levels (agent, queue, priority) AS (
        -- The priority levels of each (agent, queue), highest first: one descent each.
        SELECT p.agent, p.queue, (
            SELECT r.priority FROM steptrail_runs AS r
            WHERE r.agent = p.agent AND r.queue = p.queue AND r.available_at IS NOT NULL
            ORDER BY r.priority DESC LIMIT 1
        ) FROM pairs AS p
        UNION ALL
        SELECT l.agent, l.queue, (
            SELECT r.priority FROM steptrail_runs AS r
            WHERE r.agent = l.agent AND r.queue = l.queue AND r.priority < l.priority
              AND r.available_at IS NOT NULL
            ORDER BY r.priority DESC LIMIT 1
        ) FROM levels AS l WHERE l.priority IS NOT NULL
    ), picked AS MATERIALIZED (
        SELECT p.run_id, p.version, p.priority, p.available_at
        FROM levels AS l
        CROSS JOIN LATERAL (
            SELECT r.run_id, r.version, r.priority, r.available_at FROM steptrail_runs AS r
            WHERE r.agent = l.agent AND r.queue = l.queue AND r.priority = l.priority
              AND r.available_at <= now() AND r.available_at IS NOT NULL
            ORDER BY r.available_at, r.run_id
            LIMIT p_limit
            FOR UPDATE OF r SKIP LOCKED
        ) AS p
        WHERE l.priority IS NOT NULL
        ORDER BY p.priority DESC, p.available_at, p.run_id
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
            updated_at = e.recorded_at,
            -- Claimed folded from a waiting status (its deadline passed; Run.Claimed.apply):
            -- the wait becomes the one the run woke from.
            doc = CASE WHEN r.status = 'queued' THEN r.doc ELSE r.doc || jsonb_build_object(
                'waiting', NULL, 'wake_after_ms', NULL, 'woke', r.doc -> 'waiting'
            ) END
        FROM claimed_event AS e
        WHERE r.run_id = e.originator_id
        RETURNING r.*
    )
    -- The request is read here too, in the same snapshot (ADR 0048).
    SELECT c::steptrail_runs, s.body
    FROM claimed AS c
    LEFT JOIN steptrail_saved AS s ON s.run_id = c.run_id AND s.kind = 'request';
END
$$;

-- The claim is planned once per session and joins by nested loops only (ADR 0060).
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint, text[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint, text[])
    SET enable_hashjoin = off;
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint, text[])
    SET enable_mergejoin = off;

-- A settle that claims the worker's next run (ADR 0058), from the worker's queues.
CREATE FUNCTION steptrail_append_claim(
    p_run_id uuid,
    p_expected bigint,
    p_versions bigint[],
    p_topics text[],
    p_states bytea[],
    p_agent text,
    p_status text,
    p_version bigint,
    p_segment text,
    p_holder text,
    p_lease_ms bigint,
    p_claim_version bigint,
    p_requeue_count integer,
    p_reason text,
    p_idempotency_key text,
    p_doc jsonb,
    p_retry_delay_ms bigint,
    p_resumable bytea,
    p_drop_saved boolean,
    p_notify boolean,
    p_j_seqs bigint[],
    p_j_positions integer[],
    p_j_kinds text[],
    p_j_names text[],
    p_j_fingerprints text[],
    p_j_outcomes bytea[],
    p_claim_agents text[],
    p_claim_limit integer,
    p_claim_topic text,
    p_claim_state bytea,
    p_claim_holder text,
    p_claim_lease_ms bigint,
    p_claim_queues text[]
)
RETURNS TABLE (run steptrail_runs, request bytea)
LANGUAGE plpgsql VOLATILE ROWS 1
AS $$
BEGIN
    PERFORM steptrail_append(
        p_run_id, p_expected, p_versions, p_topics, p_states, p_agent, p_status, p_version,
        p_segment, p_holder, p_lease_ms, p_claim_version, p_requeue_count, p_reason,
        p_idempotency_key, p_doc, p_retry_delay_ms, p_resumable, p_drop_saved, p_notify,
        p_j_seqs, p_j_positions, p_j_kinds, p_j_names, p_j_fingerprints, p_j_outcomes
    );
    RETURN QUERY SELECT c.run, c.request FROM steptrail_claim(
        p_claim_agents, p_claim_limit, p_claim_topic, p_claim_state, p_claim_holder,
        p_claim_lease_ms, p_claim_queues
    ) AS c;
END;
$$;
