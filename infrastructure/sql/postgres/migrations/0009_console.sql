-- The operator console and `steptrail retry` (issue 13).
--
-- 1. Keyset pagination of the runs page: newest first, (created_at, run_id) as the key, one
--    index per filter that drives the walk (ADR 0026), and ended_at for the throughput chart.
-- 2. A failed run keeps its saved request until it is purged or retried (ADR 0025), so that
--    an operator can put it back on the queue: steptrail_append's settle no longer drops it.
CREATE INDEX steptrail_view_run_summaries_created_idx
    ON steptrail_view_run_summaries (created_at DESC, run_id DESC);
CREATE INDEX steptrail_view_run_summaries_status_created_idx
    ON steptrail_view_run_summaries (status, created_at DESC, run_id DESC);
CREATE INDEX steptrail_view_run_summaries_agent_created_idx
    ON steptrail_view_run_summaries (agent, created_at DESC, run_id DESC);
CREATE INDEX steptrail_view_run_summaries_agent_status_created_idx
    ON steptrail_view_run_summaries (agent, status, created_at DESC, run_id DESC);
CREATE INDEX steptrail_view_run_summaries_reason_created_idx
    ON steptrail_view_run_summaries (reason, created_at DESC, run_id DESC);
CREATE INDEX steptrail_view_run_summaries_ended_idx
    ON steptrail_view_run_summaries (ended_at) WHERE ended_at IS NOT NULL;

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
        -- A failed run keeps its request until it is purged or retried (ADR 0025).
        DELETE FROM steptrail_saved
        WHERE run_id = p_run_id AND NOT (p_status = 'failed' AND kind = 'request');
    END IF;
    IF p_notify THEN
        PERFORM pg_notify('steptrail_queued', p_agent);
    END IF;
END;
$$;
