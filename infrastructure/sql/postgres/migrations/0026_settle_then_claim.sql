-- A settle that also claims the worker's next run, in one statement and one transaction
-- (ADR 0058). The worker's thread whose run just settled would otherwise free its slot and
-- the worker would send a claim of its own: two round trips and two commits per run where
-- one does. This function is steptrail_append followed by steptrail_claim, nothing more:
--
-- * The append runs first and keeps its fence: a stale settle raises steptrail_append's
--   SQLSTATE and the whole statement rolls back, the claim with it, exactly as a stale
--   append alone would. A claim never runs for a writer that lost its run.
-- * The claim is steptrail_claim itself, with its lock order (the run index, then the log;
--   ADR 0054), its own snapshots (ADR 0048) and its planner-proof walk (ADR 0037). The
--   append already holds ROW EXCLUSIVE on both tables, so the claim's table lock is one the
--   transaction holds; it waits on no row (SKIP LOCKED).
-- * The settled run is not queued (it is completed, failed, waiting, cancelled, or queued
--   with a backoff that started now and so became available after this claim's now()):
--   the claim never takes the run the same statement settled.
CREATE OR REPLACE FUNCTION steptrail_append_claim(
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
    p_claim_lease_ms bigint
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
        p_claim_lease_ms
    ) AS c;
END;
$$;
