-- An idle worker sees keyed runs' due times too (ADR 0087, issue 27). The keyed runs with a
-- due time of their own (suspended with a deadline, or requeued: requeue_count > 0), by
-- (agent, queue, available_at), with their key: a partial index, so a run as enqueued (its
-- enqueue wakes the workers) and a claimed, running or settled one are not in it. sqlite_wake.py walks it for each
-- (agent, queue): the earliest due time still to come (one descent), and a due time passed
-- only if its key has a free place (the keys table of 0035), among the latest 32, so a run
-- held back by its key's limit does not make an idle worker claim again at once.
CREATE INDEX IF NOT EXISTS steptrail_runs_keyed_due_idx
    ON steptrail_runs (agent, queue, available_at, concurrency_key)
    WHERE available_at IS NOT NULL AND concurrency_limit IS NOT NULL
      AND (status <> 'queued' OR requeue_count > 0);
