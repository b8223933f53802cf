-- Concurrency limits per key (ADR 0078, issue 28).
--
-- 1. A run may carry a concurrency key and the limit resolved for it at enqueue: two
--    columns of the run index, NULL for a run without a key (every existing run).
-- 2. The claim index serves runs without a key only (its predicate gains
--    `concurrency_limit IS NULL`: their claim is the walk ADR 0077 built, unchanged);
--    keyed runs have an index of their own, by key, in claim order within the key.
-- 3. steptrail_concurrency_keys: one row per key with its limit, the runs of it running
--    and pending (claimable now or later), and when it was last served (a sequence
--    number). A trigger on the run index keeps the counts in the transaction of every
--    write that changes them (enqueue, claim, settle, suspend, reclaim, purge, rebuild).
-- 4. steptrail_claim takes keyed runs too, in the same statement: the keys with a free
--    place, least recently served first, each key's row locked FOR UPDATE SKIP LOCKED (two
--    claimers never both take its last place), each key's due runs up to its free places;
--    merged with the plain runs by (priority DESC, available_at, run_id).
-- Its signature is unchanged, so steptrail_append_claim (a settle's claim) keeps calling it.
ALTER TABLE steptrail_runs ADD COLUMN IF NOT EXISTS concurrency_key text;
ALTER TABLE steptrail_runs ADD COLUMN IF NOT EXISTS concurrency_limit integer;

DROP INDEX IF EXISTS steptrail_runs_claim_idx;
CREATE INDEX steptrail_runs_claim_idx
    ON steptrail_runs (agent, queue, priority DESC, available_at, run_id)
    WHERE available_at IS NOT NULL AND concurrency_limit IS NULL;
CREATE INDEX IF NOT EXISTS steptrail_runs_keyed_idx
    ON steptrail_runs (concurrency_key, priority DESC, available_at, run_id)
    WHERE available_at IS NOT NULL AND concurrency_limit IS NOT NULL;
-- A key's runs by status: the count of its running runs, read by verify and the recount.
CREATE INDEX IF NOT EXISTS steptrail_runs_key_status_idx
    ON steptrail_runs (concurrency_key, status) WHERE concurrency_key IS NOT NULL;

CREATE SEQUENCE IF NOT EXISTS steptrail_concurrency_served;
CREATE TABLE IF NOT EXISTS steptrail_concurrency_keys (
    key text PRIMARY KEY,
    concurrency_limit integer NOT NULL,
    running integer NOT NULL DEFAULT 0,
    pending integer NOT NULL DEFAULT 0,
    last_served bigint NOT NULL DEFAULT 0
);
-- The claim's walk: keys with a free place and something to take, least recently served first.
CREATE INDEX IF NOT EXISTS steptrail_concurrency_keys_ready_idx
    ON steptrail_concurrency_keys (last_served, key)
    WHERE pending > 0 AND running < concurrency_limit;

-- The counts follow the run index. An update that changes none of status, claimability,
-- key or limit (a step, a renewal) does not fire it (the WHEN clauses).
CREATE OR REPLACE FUNCTION steptrail_concurrency_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.concurrency_key IS NOT NULL THEN
        UPDATE steptrail_concurrency_keys SET
            running = running - (OLD.status = 'running')::integer,
            pending = pending - (OLD.available_at IS NOT NULL)::integer
        WHERE key = OLD.concurrency_key;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.concurrency_key IS NOT NULL THEN
        INSERT INTO steptrail_concurrency_keys AS k (key, concurrency_limit, running, pending)
        VALUES (
            NEW.concurrency_key, NEW.concurrency_limit, (NEW.status = 'running')::integer,
            (NEW.available_at IS NOT NULL)::integer
        )
        ON CONFLICT (key) DO UPDATE SET
            -- The limit of the key's latest enqueue (App.limit changed: from its next run).
            concurrency_limit = CASE WHEN TG_OP = 'INSERT'
                THEN excluded.concurrency_limit ELSE k.concurrency_limit END,
            running = k.running + excluded.running,
            pending = k.pending + excluded.pending,
            -- Served: one of its runs was just claimed.
            last_served = CASE WHEN NEW.status = 'running'
                AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'running')
                THEN nextval('steptrail_concurrency_served') ELSE k.last_served END;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS steptrail_concurrency_insert ON steptrail_runs;
CREATE TRIGGER steptrail_concurrency_insert AFTER INSERT ON steptrail_runs
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION steptrail_concurrency_count();
DROP TRIGGER IF EXISTS steptrail_concurrency_update ON steptrail_runs;
CREATE TRIGGER steptrail_concurrency_update AFTER UPDATE ON steptrail_runs
    FOR EACH ROW WHEN (
        (OLD.concurrency_key IS NOT NULL OR NEW.concurrency_key IS NOT NULL) AND (
            OLD.status IS DISTINCT FROM NEW.status
            OR (OLD.available_at IS NULL) <> (NEW.available_at IS NULL)
            OR OLD.concurrency_key IS DISTINCT FROM NEW.concurrency_key
        )
    )
    EXECUTE FUNCTION steptrail_concurrency_count();
DROP TRIGGER IF EXISTS steptrail_concurrency_delete ON steptrail_runs;
CREATE TRIGGER steptrail_concurrency_delete AFTER DELETE ON steptrail_runs
    FOR EACH ROW WHEN (OLD.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION steptrail_concurrency_count();

CREATE OR REPLACE FUNCTION steptrail_claim(
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
            WHERE r.agent = a.agent AND r.available_at IS NOT NULL AND r.concurrency_limit IS NULL
              AND r.concurrency_limit IS NULL
            ORDER BY r.queue LIMIT 1
        ) FROM unnest(p_agents) AS a(agent) WHERE p_queues IS NULL
        UNION ALL
        SELECT f.agent, (
            SELECT r.queue FROM steptrail_runs AS r
            WHERE r.agent = f.agent AND r.queue > f.queue AND r.available_at IS NOT NULL
              AND r.concurrency_limit IS NULL
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
              AND r.concurrency_limit IS NULL
            ORDER BY r.priority DESC LIMIT 1
        ) FROM pairs AS p
        UNION ALL
        SELECT l.agent, l.queue, (
            SELECT r.priority FROM steptrail_runs AS r
            WHERE r.agent = l.agent AND r.queue = l.queue AND r.priority < l.priority
              AND r.available_at IS NOT NULL AND r.concurrency_limit IS NULL
            ORDER BY r.priority DESC LIMIT 1
        ) FROM levels AS l WHERE l.priority IS NOT NULL
    ), plain AS MATERIALIZED (
        SELECT p.run_id, p.version, p.priority, p.available_at
        FROM levels AS l
        CROSS JOIN LATERAL (
            SELECT r.run_id, r.version, r.priority, r.available_at FROM steptrail_runs AS r
            WHERE r.agent = l.agent AND r.queue = l.queue AND r.priority = l.priority
              AND r.available_at <= now() AND r.available_at IS NOT NULL
              AND r.concurrency_limit IS NULL
            ORDER BY r.available_at, r.run_id
            LIMIT p_limit
            FOR UPDATE OF r SKIP LOCKED
        ) AS p
        WHERE l.priority IS NOT NULL
        ORDER BY p.priority DESC, p.available_at, p.run_id
        LIMIT p_limit
    ), ready AS MATERIALIZED (
        -- Keyed runs (ADR 0078): the keys with a free place and runs to take, least recently
        -- served first, at most one per place of the batch. Each key's row is locked, so no
        -- other claimer counts the same free places (its counts are read from the row
        -- version the lock returns, not from this statement's snapshot).
        SELECT k.key, k.concurrency_limit - k.running AS free
        FROM steptrail_concurrency_keys AS k
        WHERE k.pending > 0 AND k.running < k.concurrency_limit
        ORDER BY k.last_served, k.key
        LIMIT p_limit
        FOR UPDATE OF k SKIP LOCKED
    ), keyed AS MATERIALIZED (
        SELECT p.run_id, p.version, p.priority, p.available_at, k.key
        FROM ready AS k
        CROSS JOIN LATERAL (
            SELECT r.run_id, r.version, r.priority, r.available_at FROM steptrail_runs AS r
            WHERE r.concurrency_key = k.key AND r.concurrency_limit IS NOT NULL
              AND r.available_at <= now() AND r.available_at IS NOT NULL
              AND r.agent = ANY(p_agents) AND (p_queues IS NULL OR r.queue = ANY(p_queues))
            ORDER BY r.priority DESC, r.available_at, r.run_id
            LIMIT LEAST(k.free, p_limit)
            FOR UPDATE OF r SKIP LOCKED
        ) AS p
    ), rotated AS (
        -- A key that gave this claim nothing (its runs asleep, or of agents and queues this
        -- worker does not serve) goes to the back, so the keys behind it are reached.
        UPDATE steptrail_concurrency_keys AS k
        SET last_served = nextval('steptrail_concurrency_served')
        FROM ready
        WHERE k.key = ready.key AND NOT EXISTS (SELECT 1 FROM keyed WHERE keyed.key = ready.key)
    ), picked AS MATERIALIZED (
        SELECT u.run_id, u.version, u.priority, u.available_at FROM (
            SELECT p.run_id, p.version, p.priority, p.available_at FROM plain AS p
            UNION ALL
            SELECT k.run_id, k.version, k.priority, k.available_at FROM keyed AS k
        ) AS u
        ORDER BY u.priority DESC, u.available_at, u.run_id
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

-- CREATE OR REPLACE resets the function's settings: the claim is planned once per
-- session and joins by nested loops only (ADR 0060), as before.
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint, text[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint, text[])
    SET enable_hashjoin = off;
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint, text[])
    SET enable_mergejoin = off;
