-- Hardening under faults (ADR 0016, ADR 0017).
--
-- 1. The lease clock is read after every lock. steptrail_append used now() (0004), the instant
--    its statement started: an append that waited W on a lock (a rebuild of the run index,
--    any LOCK TABLE) committed a lease ending at start + L, already W old at commit. 0005
--    reads clock_timestamp() after the run's row lock; this version takes the table locks
--    first too (in the order a rebuild takes them), so that no later statement of the
--    function can wait on a table (a LOCK TABLE of the log alone, say) after the clock was
--    read. That one instant is the events' recorded_at, the row's updated_at and the start
--    of the lease, so a rebuild of the index from the log still equals the live index.
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
        available_at = CASE
            WHEN p_status <> 'queued' THEN NULL
            WHEN status = 'queued' THEN available_at
            ELSE v_now + p_retry_delay_ms * interval '1 millisecond' END,
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

-- 2. Events recorded before migration 0004 got the migrating transaction's id as their
--    tx_id, while a reporting runner's saved position stayed (0, N): every old event sorted
--    after it and was folded twice, which wedged the views (ADR 0017). Those events were
--    written one transaction at a time in notification-id order (the old table lock), so
--    they belong at tx 0: (0, id) orders them as they committed and before every later
--    transaction. They are found as the events of the oldest tx_id when that is the
--    transaction that recorded migration 0004 (its xmin; the low 32 bits of tx_id). A runner
--    position that already names that transaction moves to tx 0 with them.
WITH pre AS (
    SELECT min(e.tx_id) AS tx
    FROM steptrail_events AS e
    HAVING min(e.tx_id) % 4294967296 = (
        SELECT m.xmin::text::bigint FROM steptrail_schema_migrations AS m WHERE m.version = 4
    )
), moved AS (
    UPDATE steptrail_tracking AS t SET position_tx = 0
    FROM pre WHERE t.position_tx = pre.tx
)
UPDATE steptrail_events AS e SET tx_id = 0 FROM pre WHERE e.tx_id = pre.tx;

-- 3. A view runner that fails on a batch keeps trying and says so where operators look
--    (`steptrail stats`, metrics): how many batches failed in a row, and the last error.
ALTER TABLE steptrail_tracking ADD COLUMN failures integer NOT NULL DEFAULT 0;
ALTER TABLE steptrail_tracking ADD COLUMN last_error text;
