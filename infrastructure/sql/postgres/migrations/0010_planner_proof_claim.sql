-- Claims, the reaper's scan and the stale-lease count cost what they return, whatever the
-- planner's statistics say (ADR 0037).
--
-- The claim index is per agent and its key is the claim's ORDER BY: a worker serving one
-- agent walks only that agent's queued runs, in claim order, and stops after its batch; a
-- backlog of another agent's runs ahead of them costs it nothing. It replaces the global
-- claimable index (an extra index on every enqueue would buy nothing).
CREATE INDEX IF NOT EXISTS steptrail_runs_queued_idx
    ON steptrail_runs (agent, available_at, run_id) WHERE status = 'queued';
DROP INDEX IF EXISTS steptrail_runs_claimable_idx;

-- The runs a claim takes: per agent, the first `p_limit` available queued runs in claim
-- order, each locked (skipping rows other claimers hold), then the first `p_limit` of those.
-- Availability is judged at the transaction's start, now(), as before (ADR 0018).
--
-- Why a function with planner settings. With stale or missing statistics (a history of
-- finished runs analysed when nothing was queued, or a fresh backlog never analysed) the
-- planner estimates a handful of queued rows and prefers reading them all through
-- steptrail_runs_status_idx (or a bitmap of this index) and sorting: a claim then costs the
-- whole backlog, and draining a backlog is quadratic. With sorts, bitmap scans and
-- sequential scans disabled here, the only plan left without a disabled step is an ordered
-- walk of steptrail_runs_queued_idx, which stops after the batch. (The one remaining sort
-- merges the per-agent batches, at most agents x p_limit rows; it is unavoidable, so it is
-- still planned.) The settings apply to this function's statements only. PL/pgSQL keeps
-- the plan for the session. jit is off because a disabled step's cost (10^10) is far above
-- jit_above_cost: the server would compile every claim (100-300 ms) to save microseconds.
CREATE FUNCTION steptrail_claimable(p_agents text[], p_limit integer)
RETURNS TABLE (run_id uuid, version bigint)
LANGUAGE plpgsql VOLATILE ROWS 16
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT picked.run_id, picked.version
    FROM unnest(p_agents) AS a(agent)
    CROSS JOIN LATERAL (
        SELECT r.run_id, r.version, r.available_at FROM steptrail_runs AS r
        WHERE r.status = 'queued' AND r.agent = a.agent AND r.available_at <= now()
        ORDER BY r.available_at, r.run_id
        LIMIT p_limit
        FOR UPDATE OF r SKIP LOCKED
    ) AS picked
    ORDER BY picked.available_at, picked.run_id
    LIMIT p_limit;
END
$$;

-- The reaper's candidates: running runs whose lease expired by the store's clock, oldest
-- deadline first, through the lease index only (the same planner settings, same reason:
-- steptrail_runs_status_idx would read every running run). statement_timestamp() is the
-- calling statement's start, after lock_for_reaper was granted (ADR 0016).
CREATE FUNCTION steptrail_stale(p_limit integer)
RETURNS SETOF steptrail_runs
LANGUAGE plpgsql STABLE ROWS 100
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM steptrail_runs
    WHERE status = 'running' AND lease_expires_at < statement_timestamp()
    ORDER BY lease_expires_at
    LIMIT p_limit;
END
$$;

-- How many leases have expired (`stats`): counted along the lease index, so it costs the
-- stale runs, not the running ones. The ORDER BY is what binds the count to that index
-- (with sorts disabled, the only unpenalised way to produce the order).
CREATE FUNCTION steptrail_stale_count()
RETURNS bigint
LANGUAGE plpgsql STABLE
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM (
        SELECT 1 FROM steptrail_runs
        WHERE status = 'running' AND lease_expires_at < now()
        ORDER BY lease_expires_at
    ) AS stale;
    RETURN n;
END
$$;
