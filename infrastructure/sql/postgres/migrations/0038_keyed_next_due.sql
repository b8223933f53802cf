-- An idle worker sees keyed runs' due times too (ADR 0087, issue 27).
--
-- steptrail_next_due (migration 0037) walked the claim index, which holds runs without a
-- concurrency key only (migration 0035): a keyed run asleep, waiting with a deadline or
-- requeued with a backoff woke at the worker's poll, not at its due time.
--
-- 1. steptrail_runs_keyed_due_idx: the keyed runs with a due time of their own, by
--    (agent, queue, available_at), with their key: suspended with a deadline (waiting_*)
--    or put back on the queue (a backoff, a reclaim: requeue_count > 0). A run as enqueued
--    is not in it (its enqueue wakes the workers), nor a claimed, running or settled one:
--    a keyed run's enqueue, first claim, steps and settle write nothing to it.
-- 2. steptrail_next_due also answers for keyed runs, per (agent, queue) of this index (a
--    loose walk of its queues when none is named):
--    * the earliest due time still to come: one descent from now();
--    * a due time already passed counts only if its key has a free place (the keys table,
--      kept by the triggers of migration 0035): such a run is claimable (it came due
--      between the claim's clock and this call, or the claim's walk of the keys had not
--      reached it), so the worker claims again at once. A run held back by its key's limit
--      does not count: the worker would claim again every 5 ms and find nothing. Its key
--      is released by a settle, which the releasing worker's next claim follows, and
--      otherwise the idle worker finds it at its poll, as before. The 32 latest due runs
--      are looked at (backwards from now()), not the whole held-back backlog.
-- The signature and settings are those of 0037 (CREATE OR REPLACE sets them again).
CREATE INDEX IF NOT EXISTS steptrail_runs_keyed_due_idx
    ON steptrail_runs (agent, queue, available_at, concurrency_key)
    WHERE available_at IS NOT NULL AND concurrency_limit IS NOT NULL
      AND (status <> 'queued' OR requeue_count > 0);

CREATE OR REPLACE FUNCTION steptrail_next_due(p_agents text[], p_queues text[])
RETURNS double precision
LANGUAGE plpgsql STABLE
SET jit = off SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off
SET enable_hashjoin = off SET enable_mergejoin = off
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
    ), keyed_found (agent, queue) AS (
        -- The queues an agent has keyed runs in, claimable now or later (p_queues NULL).
        SELECT a.agent, (
            SELECT r.queue FROM steptrail_runs AS r
            WHERE r.agent = a.agent AND r.available_at IS NOT NULL
              AND r.concurrency_limit IS NOT NULL
              AND (r.status <> 'queued' OR r.requeue_count > 0)
            ORDER BY r.queue LIMIT 1
        ) FROM unnest(p_agents) AS a(agent) WHERE p_queues IS NULL
        UNION ALL
        SELECT f.agent, (
            SELECT r.queue FROM steptrail_runs AS r
            WHERE r.agent = f.agent AND r.queue > f.queue AND r.available_at IS NOT NULL
              AND r.concurrency_limit IS NOT NULL
              AND (r.status <> 'queued' OR r.requeue_count > 0)
            ORDER BY r.queue LIMIT 1
        ) FROM keyed_found AS f WHERE f.queue IS NOT NULL
    ), keyed_pairs AS (
        SELECT f.agent, f.queue FROM keyed_found AS f WHERE f.queue IS NOT NULL
        UNION ALL
        SELECT a.agent, q.queue
        FROM unnest(p_agents) AS a(agent) CROSS JOIN unnest(p_queues) AS q(queue)
    ), due (at) AS (
        -- Each level's earliest run without a key.
        SELECT d.available_at
        FROM levels AS l
        CROSS JOIN LATERAL (
            SELECT r.available_at FROM steptrail_runs AS r
            WHERE r.agent = l.agent AND r.queue = l.queue AND r.priority = l.priority
              AND r.available_at IS NOT NULL AND r.concurrency_limit IS NULL
            ORDER BY r.available_at LIMIT 1
        ) AS d
        WHERE l.priority IS NOT NULL
        UNION ALL
        -- Each (agent, queue)'s earliest keyed due time still to come.
        SELECT (
            SELECT r.available_at FROM steptrail_runs AS r
            WHERE r.agent = p.agent AND r.queue = p.queue AND r.available_at > now()
              AND r.available_at IS NOT NULL AND r.concurrency_limit IS NOT NULL
              AND (r.status <> 'queued' OR r.requeue_count > 0)
            ORDER BY r.available_at LIMIT 1
        ) FROM keyed_pairs AS p
        UNION ALL
        -- A keyed due time passed, of a key with a free place, among the latest 32.
        SELECT (
            SELECT max(c.available_at) FROM (
                SELECT r.available_at, r.concurrency_key FROM steptrail_runs AS r
                WHERE r.agent = p.agent AND r.queue = p.queue AND r.available_at <= now()
                  AND r.available_at IS NOT NULL AND r.concurrency_limit IS NOT NULL
              AND (r.status <> 'queued' OR r.requeue_count > 0)
                ORDER BY r.available_at DESC LIMIT 32
            ) AS c
            WHERE EXISTS (
                SELECT 1 FROM steptrail_concurrency_keys AS k
                WHERE k.key = c.concurrency_key AND k.running < k.concurrency_limit
            )
        ) FROM keyed_pairs AS p
    )
    SELECT extract(epoch FROM min(due.at) - now())::float8 AS due_in_s FROM due
    );
END
$$;
