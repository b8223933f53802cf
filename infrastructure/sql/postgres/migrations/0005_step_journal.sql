-- The step journal (ADR 0013): each recorded step's verbatim outcome, beside the log, so a
-- later segment of the run can hand it back instead of running the step again. Resumable-
-- state-grade content: written in the same transaction as the step's StepRecorded, deleted in
-- the transaction that settles the run, and by purge with the run. `position` is which step
-- call of the agent's execution the entry answers; `outcome` is JSON (a value or an error).
-- No foreign key to the run index: journal rows are only written by steptrail_append after
-- its fence found the run's row, and a key check per row would cost the hot path for nothing.
CREATE TABLE steptrail_journal (
    run_id uuid NOT NULL,
    seq bigint NOT NULL,
    position integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    fingerprint text NOT NULL,
    outcome bytea NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- steptrail_append gains the journal rows (one round trip still carries a step's record and
-- its outcome). The old signature is dropped so no caller can append a step without them.
DROP FUNCTION steptrail_append(
    uuid, bigint, bigint[], text[], bytea[], text, text, bigint, text, text, bigint, bigint,
    integer, text, text, jsonb, bigint, bytea, boolean, boolean
);

CREATE FUNCTION steptrail_append(
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
    -- The fence: the row must still be at the version the writer last saw. Locking it makes a
    -- concurrent writer of this run wait here, then find the version moved (the WHERE is
    -- re-checked on the row it waited for) and fail.
    PERFORM 1 FROM steptrail_runs WHERE run_id = p_run_id AND version = p_expected FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is not at version % (moved on, or purged)', p_run_id, p_expected
            USING ERRCODE = 'ST409';
    END IF;
    -- The store's clock, read once the row lock is held: now() is the transaction's start,
    -- which may be long before a writer that queued on the lock gets it, and a lease must
    -- start when the write that grants it happens, not when it began waiting. (Issue 10
    -- makes the other writers read the clock the same way.)
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
    -- The events carry the same instant, so a run index rebuilt from the log (whose folds
    -- read recorded_at) equals the live one.
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
