-- Waits that end by time or by a signal (ADR 0068, 0073): durable sleep, signals, deadlines.
--
-- 1. `available_at` is when the claim may take a run, for every status: a waiting run with a
--    deadline has it too. The claim index covers every row that has one, so the claim walks
--    one index as before and a million sleeping runs sit after now() in it.
-- 2. The append sets a waiting run's available_at from the duration it passes
--    (p_retry_delay_ms, negative for no deadline).
-- 3. The claim takes a waiting run whose deadline passed and folds Claimed from its waiting
--    status in the document as Run.Claimed.apply does.
-- 4. The inbox of signals, beside the log (not in it: a signal for a running run must not
--    move the run's version under its holder).
CREATE INDEX IF NOT EXISTS steptrail_runs_available_idx
    ON steptrail_runs (agent, available_at, run_id) WHERE available_at IS NOT NULL;
DROP INDEX IF EXISTS steptrail_runs_queued_idx;

CREATE TABLE IF NOT EXISTS steptrail_signals (
    run_id uuid NOT NULL,
    seq bigint NOT NULL,
    name text NOT NULL,
    payload bytea NOT NULL,
    sent_by text NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, seq)
);

CREATE OR REPLACE FUNCTION steptrail_append(
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
    p_j_outcomes bytea[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
BEGIN
    -- Every lock first: the tables (a rebuild or a LOCK TABLE makes us wait here), then the
    -- run's row, which is also the fence (a concurrent writer of this run makes us wait
    -- here; the WHERE is re-checked on the row we waited for, and the version has moved).
    LOCK TABLE steptrail_runs, steptrail_events, steptrail_saved, steptrail_journal
        IN ROW EXCLUSIVE MODE;
    PERFORM 1 FROM steptrail_runs
    WHERE run_id = p_run_id AND version = p_expected
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is not at version % (moved on, or purged)', p_run_id, p_expected
            USING ERRCODE = 'ST409';
    END IF;
    -- Then the clock: nothing below waits on a lock, so the lease starts at most the time of
    -- a few inserts before the commit (ADR 0016).
    v_now := clock_timestamp();
    -- The run index rule is the same as projections.run_index.row_after.
    UPDATE steptrail_runs SET
        agent = p_agent,
        status = p_status,
        version = p_version,
        segment = p_segment,
        holder = p_holder,
        lease_ms = p_lease_ms,
        claim_version = p_claim_version,
        requeue_count = p_requeue_count,
        reason = p_reason,
        idempotency_key = p_idempotency_key,
        doc = p_doc,
        lease_expires_at = CASE WHEN p_status = 'running'
            THEN v_now + p_lease_ms * interval '1 millisecond' END,
        -- When the claim may take the run (ADR 0068): a queued run after its retry delay
        -- (kept while it stays queued); a waiting run at its deadline, p_retry_delay_ms after
        -- the suspending append (negative: no deadline); any other run never by itself.
        available_at = CASE
            WHEN p_status = 'queued' THEN CASE
                WHEN status = 'queued' THEN available_at
                ELSE v_now + p_retry_delay_ms * interval '1 millisecond' END
            WHEN p_status IN (
                'waiting_for_approval', 'waiting_for_input', 'waiting_for_timer',
                'waiting_for_event'
            ) AND p_retry_delay_ms >= 0 THEN CASE
                WHEN status = p_status AND available_at IS NOT NULL THEN available_at
                ELSE v_now + p_retry_delay_ms * interval '1 millisecond' END
            END,
        updated_at = v_now
    WHERE run_id = p_run_id;
    INSERT INTO steptrail_events (originator_id, originator_version, topic, state, recorded_at)
    SELECT p_run_id, v, t, s, v_now FROM unnest(p_versions, p_topics, p_states) AS e(v, t, s);
    IF cardinality(p_j_seqs) > 0 THEN
        INSERT INTO steptrail_journal (run_id, seq, position, kind, name, fingerprint, outcome)
        SELECT p_run_id, q, p, k, n, f, o
        FROM unnest(p_j_seqs, p_j_positions, p_j_kinds, p_j_names, p_j_fingerprints, p_j_outcomes)
            AS j(q, p, k, n, f, o);
    END IF;
    IF p_resumable IS NOT NULL THEN
        INSERT INTO steptrail_saved (run_id, kind, body) VALUES (p_run_id, 'resumable', p_resumable)
        ON CONFLICT (run_id, kind) DO UPDATE SET body = EXCLUDED.body;
    END IF;
    IF p_drop_saved THEN
        DELETE FROM steptrail_saved WHERE run_id = p_run_id;
        DELETE FROM steptrail_journal WHERE run_id = p_run_id;
    END IF;
    IF p_notify THEN
        PERFORM pg_notify('steptrail_queued', p_agent);
    END IF;
END;
$$;

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
            WHERE r.agent = a.agent AND r.available_at <= now() AND r.available_at IS NOT NULL
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
    -- The request is read here too, in the same snapshot: a run enqueued after the calling
    -- statement began has its saved request visible only to this statement.
    SELECT c::steptrail_runs, s.body
    FROM claimed AS c
    LEFT JOIN steptrail_saved AS s ON s.run_id = c.run_id AND s.kind = 'request';
END
$$;

-- The function was replaced: its settings of migrations 0023 and 0028 are set again.
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint)
    SET enable_hashjoin = off;
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint)
    SET enable_mergejoin = off;
