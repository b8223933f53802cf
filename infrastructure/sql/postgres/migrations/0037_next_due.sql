-- When an idle worker next has something to claim (ADR 0082, issue 27).
--
-- Nothing notifies when a sleeper's timer, a wait's deadline or a retry's backoff comes
-- due: the time is a column (available_at), not a write. An idle worker asks
-- steptrail_next_due how far away the earliest such time is among the runs it may claim and
-- waits no longer than that (and no longer than its poll interval).
--
-- The answer is the seconds from now() (the server's clock, skipped by the testing kit's
-- clock) to the earliest available_at among the runs without a concurrency key of the
-- agents and queues asked for (NULL: every queue); NULL when there is none. It is not
-- bounded below by now(): a run that came due after the claim's own now() and before this
-- call is claimable at once, and says so with a result <= 0.
--
-- The same loose walk of the claim index as steptrail_claim (ADR 0077): one descent per
-- queue, one per priority level, one per level for its earliest run, so a million sleepers
-- cost what one does. Keyed runs (their own index, by key, migration 0035) are not looked
-- at: their wake-ups wait for the poll.
--
-- A function, not a named query, for its settings: the recursive walk's estimates (100 rows
-- per unnest, ten per recursion) cost it past jit_above_cost, and JIT compiled the plan on
-- every call (20 to 400 ms for a walk of a few index pages); as steptrail_claim, it is
-- planned once per session and walks the index whatever the statistics say.
CREATE OR REPLACE FUNCTION steptrail_next_due(p_agents text[], p_queues text[])
RETURNS double precision
LANGUAGE plpgsql STABLE
SET jit = off SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (
    WITH RECURSIVE found (agent, queue) AS (
        SELECT a.agent, (
            SELECT r.queue FROM steptrail_runs AS r
            WHERE r.agent = a.agent AND r.available_at IS NOT NULL AND r.concurrency_limit IS NULL
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
        SELECT a.agent, q.queue
        FROM unnest(p_agents) AS a(agent) CROSS JOIN unnest(p_queues) AS q(queue)
    ), levels (agent, queue, priority) AS (
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
    )
    SELECT extract(epoch FROM min(d.available_at) - now())::float8 AS due_in_s
    FROM levels AS l
    CROSS JOIN LATERAL (
        SELECT r.available_at FROM steptrail_runs AS r
        WHERE r.agent = l.agent AND r.queue = l.queue AND r.priority = l.priority
          AND r.available_at IS NOT NULL AND r.concurrency_limit IS NULL
        ORDER BY r.available_at LIMIT 1
    ) AS d
    WHERE l.priority IS NOT NULL
    );
END
$$;
