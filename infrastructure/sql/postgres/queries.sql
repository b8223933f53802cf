-- Named queries for PostgreSQL. Every write runs inside one transaction sent as one pipeline
-- (one network round trip, one commit): BEGIN, lock_events, the statements, COMMIT.

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS steptrail_schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_lock
-- One migrator at a time, whichever machine it runs on; the others wait, then find nothing
-- left to do. The key is arbitrary but fixed ("steptrail" in a 32-bit space).
SELECT pg_advisory_xact_lock(1937337197);

-- name: applied_migrations
SELECT version FROM steptrail_schema_migrations ORDER BY version;

-- name: record_migration
INSERT INTO steptrail_schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: lock_events
-- Serialise the writers of the log until they commit, so notification ids are issued in
-- commit order and a reader tailing the log never passes a gap that fills in later. This is
-- the eventsourcing library's choice (PostgresApplicationRecorder._lock_table) and we keep
-- it: EXCLUSIVE mode still lets SELECTs run. It also gives every write the same lock order
-- (the log first, then one run row), so writers cannot deadlock. The lock is held for one
-- pipelined transaction only: no client round trip happens while it is held.
LOCK TABLE steptrail_events IN EXCLUSIVE MODE;

-- name: insert_events
-- The primary key (originator_id, originator_version) is the fence: an append at a version
-- somebody already used fails here, and the whole transaction with it.
INSERT INTO steptrail_events (originator_id, originator_version, topic, state)
SELECT * FROM unnest(
    %(ids)s::uuid[], %(versions)s::bigint[], %(topics)s::text[], %(states)s::bytea[]
);

-- name: insert_run
-- A new run's row, creation event and saved request, unless its idempotency key is taken:
-- then nothing is inserted and no row comes back (the caller reads the existing run).
WITH new_run AS (
    INSERT INTO steptrail_runs (
        run_id, agent, status, version, segment, holder, lease_ms, claim_version,
        requeue_count, reason, idempotency_key, doc,
        lease_expires_at, available_at, created_at, updated_at
    ) VALUES (
        %(run_id)s, %(agent)s, %(status)s, %(version)s, %(segment)s, %(holder)s,
        %(lease_ms)s, %(claim_version)s, %(requeue_count)s, %(reason)s,
        %(idempotency_key)s, %(doc)s,
        CASE WHEN %(status)s = 'running'
            THEN now() + %(lease_ms)s::bigint * interval '1 millisecond' END,
        CASE WHEN %(status)s = 'queued'
            THEN now() + %(retry_delay_ms)s::bigint * interval '1 millisecond' END,
        now(), now()
    )
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING run_id
), new_event AS (
    INSERT INTO steptrail_events (originator_id, originator_version, topic, state)
    SELECT run_id, 1, %(topic)s, %(state)s FROM new_run
), new_request AS (
    INSERT INTO steptrail_saved (run_id, kind, body)
    SELECT run_id, 'request', %(request)s::bytea FROM new_run
    WHERE %(request)s::bytea IS NOT NULL
)
SELECT run_id FROM new_run;

-- name: update_run
-- The run index follows the events in the same transaction (projections.run_index.row_after
-- is the same rule in Python, used to rebuild). In SET, a bare column is the old value.
UPDATE steptrail_runs SET
    agent = %(agent)s,
    status = %(status)s,
    version = %(version)s,
    segment = %(segment)s,
    holder = %(holder)s,
    lease_ms = %(lease_ms)s,
    claim_version = %(claim_version)s,
    requeue_count = %(requeue_count)s,
    reason = %(reason)s,
    idempotency_key = %(idempotency_key)s,
    doc = %(doc)s,
    lease_expires_at = CASE WHEN %(status)s = 'running'
        THEN now() + %(lease_ms)s::bigint * interval '1 millisecond' END,
    available_at = CASE
        WHEN %(status)s <> 'queued' THEN NULL
        WHEN status = 'queued' THEN available_at
        ELSE now() + %(retry_delay_ms)s::bigint * interval '1 millisecond' END,
    updated_at = now()
WHERE run_id = %(run_id)s;

-- name: put_saved
INSERT INTO steptrail_saved (run_id, kind, body) VALUES (%(run_id)s, %(kind)s, %(body)s)
ON CONFLICT (run_id, kind) DO UPDATE SET body = EXCLUDED.body;

-- name: drop_saved
DELETE FROM steptrail_saved WHERE run_id = %(run_id)s;

-- name: notify_queued
-- Delivered at commit; idle workers LISTENing wake at once instead of polling.
SELECT pg_notify('steptrail_queued', %(agent)s);

-- name: claim
-- Take the queued run that became available first, in one statement: pick and lock its row,
-- append Claimed at the next version, and update the row to running under the new lease.
-- The Claimed payload does not depend on the run, so it is serialised by the caller; the
-- column updates are the Claimed fold (Run.Claimed.apply), which the rebuild test checks.
WITH picked AS (
    SELECT run_id, version FROM steptrail_runs
    WHERE status = 'queued' AND available_at <= now() AND agent = ANY(%(agents)s::text[])
    ORDER BY available_at, run_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), claimed_event AS (
    INSERT INTO steptrail_events (originator_id, originator_version, topic, state)
    SELECT run_id, version + 1, %(topic)s, %(state)s FROM picked
    RETURNING originator_id, originator_version
), claimed AS (
    UPDATE steptrail_runs AS r SET
        status = 'running',
        version = e.originator_version,
        segment = 'worker',
        holder = %(holder)s,
        lease_ms = %(lease_ms)s,
        claim_version = e.originator_version,
        lease_expires_at = now() + %(lease_ms)s::bigint * interval '1 millisecond',
        available_at = NULL,
        updated_at = now()
    FROM claimed_event AS e
    WHERE r.run_id = e.originator_id
    RETURNING r.*
)
SELECT c.*, s.body AS request
FROM claimed AS c
LEFT JOIN steptrail_saved AS s ON s.run_id = c.run_id AND s.kind = 'request';

-- name: select_run
SELECT * FROM steptrail_runs WHERE run_id = %(run_id)s;

-- name: select_run_by_key
SELECT * FROM steptrail_runs WHERE idempotency_key = %(idempotency_key)s;

-- name: select_saved
SELECT body FROM steptrail_saved WHERE run_id = %(run_id)s AND kind = %(kind)s;

-- name: select_stale
-- Only running runs whose lease expired by the store's clock, oldest deadline first; the
-- partial index on lease_expires_at makes this proportional to the stale runs returned.
SELECT * FROM steptrail_runs
WHERE status = 'running' AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT %(limit)s;

-- name: select_history
SELECT originator_version AS version, recorded_at, topic, state, notification_id
FROM steptrail_events
WHERE originator_id = %(run_id)s
ORDER BY originator_version;

-- name: select_log
-- Every event of every run, run by run, for rebuilding the run index.
SELECT originator_id AS run_id, originator_version AS version, recorded_at, topic, state
FROM steptrail_events
ORDER BY originator_id, originator_version;

-- name: select_runs
-- The inbox and `steptrail runs`: newest first, every filter optional.
SELECT * FROM steptrail_runs
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY created_at DESC, run_id
LIMIT %(limit)s;

-- name: select_all_runs
SELECT * FROM steptrail_runs ORDER BY run_id;

-- name: delete_all_runs
DELETE FROM steptrail_runs;

-- name: insert_row
-- A rebuilt row, with the instants the fold computed from the events' recorded_at.
INSERT INTO steptrail_runs (
    run_id, agent, status, version, segment, holder, lease_ms, claim_version,
    requeue_count, reason, idempotency_key, doc,
    lease_expires_at, available_at, created_at, updated_at
) VALUES (
    %(run_id)s, %(agent)s, %(status)s, %(version)s, %(segment)s, %(holder)s,
    %(lease_ms)s, %(claim_version)s, %(requeue_count)s, %(reason)s,
    %(idempotency_key)s, %(doc)s,
    %(lease_expires_at)s, %(available_at)s, %(created_at)s, %(updated_at)s
);

-- name: store_now
SELECT now() AS now;

-- name: listen_queued
LISTEN steptrail_queued;

-- name: init_tracking
INSERT INTO steptrail_tracking (projection, position) VALUES (%(projection)s, 0)
ON CONFLICT (projection) DO NOTHING;

-- name: lock_tracking
-- One runner at a time per projection: the row lock is held until the batch commits, and a
-- second runner then reads the position the first one left (no event processed twice).
SELECT position FROM steptrail_tracking WHERE projection = %(projection)s FOR UPDATE;

-- name: select_tracking
SELECT position FROM steptrail_tracking WHERE projection = %(projection)s;

-- name: update_tracking
UPDATE steptrail_tracking SET position = %(position)s WHERE projection = %(projection)s;

-- name: select_notifications
-- Notification ids are issued in commit order (lock_events), so everything below the highest
-- id a reader sees is already visible: a gap is a rolled-back or purged id, never a late one.
SELECT notification_id, originator_id AS run_id, originator_version AS version, recorded_at,
       topic, state
FROM steptrail_events
WHERE notification_id > %(after)s
ORDER BY notification_id
LIMIT %(limit)s;

-- name: max_notification_id
SELECT coalesce(max(notification_id), 0) AS head FROM steptrail_events;

-- name: select_summaries
SELECT * FROM steptrail_view_run_summaries WHERE run_id = ANY(%(ids)s::uuid[]);

-- name: upsert_summary
INSERT INTO steptrail_view_run_summaries (
    run_id, agent, status, reason, state, steps, step_ms, suspensions,
    created_at, updated_at, ended_at
) VALUES (
    %(run_id)s, %(agent)s, %(status)s, %(reason)s, %(state)s, %(steps)s, %(step_ms)s,
    %(suspensions)s, %(created_at)s, %(updated_at)s, %(ended_at)s
)
ON CONFLICT (run_id) DO UPDATE SET
    agent = EXCLUDED.agent, status = EXCLUDED.status, reason = EXCLUDED.reason,
    state = EXCLUDED.state, steps = EXCLUDED.steps, step_ms = EXCLUDED.step_ms,
    suspensions = EXCLUDED.suspensions, created_at = EXCLUDED.created_at,
    updated_at = EXCLUDED.updated_at, ended_at = EXCLUDED.ended_at;

-- name: add_status_count
INSERT INTO steptrail_view_status_counts (agent, status, count)
VALUES (%(agent)s, %(status)s, %(delta)s)
ON CONFLICT (agent, status) DO UPDATE
SET count = steptrail_view_status_counts.count + EXCLUDED.count;

-- name: upsert_dead_letter
INSERT INTO steptrail_view_dead_letters (
    run_id, agent, reason, cause, failure_class, error_type, requeue_count, dead_lettered_at
) VALUES (
    %(run_id)s, %(agent)s, %(reason)s, %(cause)s, %(failure_class)s, %(error_type)s,
    %(requeue_count)s, %(dead_lettered_at)s
)
ON CONFLICT (run_id) DO UPDATE SET
    reason = EXCLUDED.reason, cause = EXCLUDED.cause, failure_class = EXCLUDED.failure_class,
    error_type = EXCLUDED.error_type, requeue_count = EXCLUDED.requeue_count,
    dead_lettered_at = EXCLUDED.dead_lettered_at;

-- name: clear_views
-- Emptying every reporting view and rewinding the runner, in one transaction (a rebuild).
DELETE FROM steptrail_view_run_summaries;
DELETE FROM steptrail_view_status_counts;
DELETE FROM steptrail_view_dead_letters;
UPDATE steptrail_tracking SET position = 0 WHERE projection = %(projection)s;

-- name: select_status_counts
SELECT agent, status, count FROM steptrail_view_status_counts WHERE count <> 0
ORDER BY agent, status;

-- name: select_reason_counts
SELECT status, reason, count(*) AS count FROM steptrail_view_run_summaries
WHERE reason IS NOT NULL GROUP BY status, reason ORDER BY status, reason;

-- name: select_dead_letters
SELECT * FROM steptrail_view_dead_letters
WHERE (%(agent)s::text IS NULL OR agent = %(agent)s)
ORDER BY dead_lettered_at DESC, run_id
LIMIT %(limit)s;

-- name: select_all_summaries
SELECT * FROM steptrail_view_run_summaries ORDER BY run_id;

-- name: select_all_dead_letters
SELECT * FROM steptrail_view_dead_letters ORDER BY run_id;

-- name: queue_health
-- Live figures from the run index (not a view): the oldest queued run and expired leases.
SELECT
    (SELECT min(updated_at) FROM steptrail_runs WHERE status = 'queued') AS oldest_queued_at,
    (SELECT count(*) FROM steptrail_runs
     WHERE status = 'running' AND lease_expires_at < now()) AS stale_leases,
    now() AS now;

-- name: count_purgeable
SELECT count(*) AS n FROM steptrail_runs
WHERE created_at < %(cutoff)s AND status = ANY(%(statuses)s::text[]);

-- name: select_purgeable
-- Oldest first. Runs under the log lock, so no writer can change the set before it is gone.
SELECT run_id FROM steptrail_runs
WHERE created_at < %(cutoff)s AND status = ANY(%(statuses)s::text[])
ORDER BY created_at, run_id
LIMIT %(limit)s;

-- name: purge_runs
-- Everything that holds anything of these runs, in one transaction: the views (counts first,
-- from the summaries the views themselves hold), the saved state, the log, the index; then
-- the tombstones. The caller holds the log lock and the reporting runner's tracking row.
UPDATE steptrail_view_status_counts AS c SET count = c.count - d.n
FROM (
    SELECT agent, status, count(*) AS n FROM steptrail_view_run_summaries
    WHERE run_id = ANY(%(ids)s::uuid[]) GROUP BY agent, status
) AS d
WHERE c.agent = d.agent AND c.status = d.status;
DELETE FROM steptrail_view_run_summaries WHERE run_id = ANY(%(ids)s::uuid[]);
DELETE FROM steptrail_view_dead_letters WHERE run_id = ANY(%(ids)s::uuid[]);
DELETE FROM steptrail_saved WHERE run_id = ANY(%(ids)s::uuid[]);
DELETE FROM steptrail_events WHERE originator_id = ANY(%(ids)s::uuid[]);
DELETE FROM steptrail_runs WHERE run_id = ANY(%(ids)s::uuid[]);
INSERT INTO steptrail_tombstones (run_id, category, purged_at)
SELECT id, %(category)s, now() FROM unnest(%(ids)s::uuid[]) AS id
ON CONFLICT (run_id) DO NOTHING;

-- name: select_tombstone
SELECT * FROM steptrail_tombstones WHERE run_id = %(run_id)s;
