-- Writers no longer serialise on a table lock (ADR 0012). Two things replace it:
--
-- 1. Every append goes through steptrail_append: it locks the run's index row and checks
--    the version there first (the fence), then inserts the events. Everything that writes a
--    run takes its row lock before touching the log, so writers of one run queue on that row
--    and writers of different runs never wait for each other.
-- 2. Notification ids no longer commit in order, so readers order the log by the inserting
--    transaction (tx_id) and read only transactions older than every one still running.
ALTER TABLE steptrail_events
    ADD COLUMN tx_id bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint);
CREATE INDEX steptrail_events_tx_idx ON steptrail_events (tx_id, notification_id);

ALTER TABLE steptrail_tracking ADD COLUMN position_tx bigint NOT NULL DEFAULT 0;

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
    p_notify boolean
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- The fence: the row must still be at the version the writer last saw. Updating it takes
    -- the row lock, so a concurrent writer of this run waits here, then finds the version
    -- moved and fails. The run index rule is the same as projections.run_index.row_after.
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
            THEN now() + p_lease_ms * interval '1 millisecond' END,
        available_at = CASE
            WHEN p_status <> 'queued' THEN NULL
            WHEN status = 'queued' THEN available_at
            ELSE now() + p_retry_delay_ms * interval '1 millisecond' END,
        updated_at = now()
    WHERE run_id = p_run_id AND version = p_expected;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is not at version % (moved on, or purged)', p_run_id, p_expected
            USING ERRCODE = 'ST409';
    END IF;
    INSERT INTO steptrail_events (originator_id, originator_version, topic, state)
    SELECT p_run_id, v, t, s FROM unnest(p_versions, p_topics, p_states) AS e(v, t, s);
    IF p_resumable IS NOT NULL THEN
        INSERT INTO steptrail_saved (run_id, kind, body) VALUES (p_run_id, 'resumable', p_resumable)
        ON CONFLICT (run_id, kind) DO UPDATE SET body = EXCLUDED.body;
    END IF;
    IF p_drop_saved THEN
        DELETE FROM steptrail_saved WHERE run_id = p_run_id;
    END IF;
    IF p_notify THEN
        PERFORM pg_notify('steptrail_queued', p_agent);
    END IF;
END;
$$;
