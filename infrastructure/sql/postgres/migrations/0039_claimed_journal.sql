-- A claimed run's journal, read by the claim statement itself (ADR 0086, issue 27).
--
-- A segment that resumes a run (after a sleep, a wait, a decision, a retry or a reclaim)
-- reads the run's journal before it calls the agent: one more round trip per resumed
-- segment, and on a woken sleeper's segment the only statement besides its claim and its
-- settle. The claim query now returns the journal of each run it took, as parallel arrays
-- in step order, through this function.
--
-- A function, VOLATILE, on purpose: in READ COMMITTED a query's own subqueries read the
-- snapshot taken when the query began, before steptrail_claim (plpgsql, each statement its
-- own snapshot) locked the rows it claims. A run whose last segment settled between those
-- two instants (it appended its last step's journal row and requeued the run) would be
-- claimed with that row missing from a plain LATERAL subquery, and its step would run
-- again. A volatile function's statement takes a fresh snapshot when it runs, which is
-- after the claim's locks: from then on no other writer can add to a claimed run's
-- journal until the claim commits. (plpgsql, so it is never inlined into the caller's
-- snapshot either.)
--
-- A run with no recorded step (p_steps = 0, a fresh run) has no journal: no lookup. A row
-- whose document does not say (NULL) is looked up.
CREATE OR REPLACE FUNCTION steptrail_claimed_journal(p_run_id uuid, p_steps bigint)
RETURNS TABLE (
    j_seq bigint[], j_position integer[], j_kind text[], j_name text[], j_fingerprint text[],
    j_outcome bytea[]
)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF p_steps IS NOT NULL AND p_steps <= 0 THEN
        RETURN QUERY SELECT NULL::bigint[], NULL::integer[], NULL::text[], NULL::text[],
            NULL::text[], NULL::bytea[];
        RETURN;
    END IF;
    RETURN QUERY
    SELECT array_agg(j.seq ORDER BY j.seq), array_agg(j.position ORDER BY j.seq),
           array_agg(j.kind ORDER BY j.seq), array_agg(j.name ORDER BY j.seq),
           array_agg(j.fingerprint ORDER BY j.seq), array_agg(j.outcome ORDER BY j.seq)
    FROM steptrail_journal AS j
    WHERE j.run_id = p_run_id;
END;
$$;
