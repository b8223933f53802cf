-- Named queries for SQLite. Every write runs in one `BEGIN IMMEDIATE` transaction, which takes
-- SQLite's single write lock up front: writers queue on the busy timeout instead of failing
-- when a read transaction tries to upgrade. The store's clock is the host's, read once inside
-- that lock and passed as :at (integer microseconds), so all rows of one commit share it.

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS steptrail_schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at INTEGER NOT NULL
);


-- name: applied_migrations
SELECT version FROM steptrail_schema_migrations ORDER BY version;

-- name: record_migration
INSERT INTO steptrail_schema_migrations (version, name, applied_at)
VALUES (:version, :name, :at);


-- name: insert_events
-- SQLite only (PostgreSQL's steptrail_append does all four of these writes in one call).
-- The UNIQUE (originator_id, originator_version) constraint is the fence.
INSERT INTO steptrail_events (originator_id, originator_version, topic, state, recorded_at)
VALUES (:id, :version, :topic, :state, :at);

-- name: append_event
-- SQLite only: insert_events for the append path, with positional parameters in this column
-- order (binding by name costs a lookup per column, on every step). `journal` is the step
-- journal's entry that rides in this event's row (ADR 0050), or NULL.
INSERT INTO steptrail_events
    (originator_id, originator_version, topic, state, journal, recorded_at)
VALUES (?, ?, ?, ?, ?, ?);

-- name: insert_run
-- SQLite: the idempotency key is checked by select_run_by_key inside the same IMMEDIATE
-- transaction before this runs, so no ON CONFLICT trickery is needed.
INSERT INTO steptrail_runs (
    run_id, agent, status, version, segment, holder, lease_ms, claim_version,
    requeue_count, reason, idempotency_key, doc,
    lease_expires_at, available_at, created_at, updated_at, queue, priority,
    concurrency_key, concurrency_limit, parent_id
) VALUES (
    :run_id, :agent, :status, :version, :segment, :holder, :lease_ms, :claim_version,
    :requeue_count, :reason, :idempotency_key, :doc,
    CASE WHEN :status = 'running' THEN :at + :lease_ms * 1000 END,
    CASE WHEN :status = 'queued' THEN :at + :retry_delay_ms * 1000 END,
    :at, :at, :queue, :priority, :concurrency_key, :concurrency_limit, :parent_id
);

-- name: select_runs_by_keys
-- enqueue_many (ADR 0044): which of a batch's idempotency keys are taken, inside the same
-- IMMEDIATE transaction as the inserts that follow.
SELECT run_id, idempotency_key FROM steptrail_runs
WHERE idempotency_key IN (SELECT value FROM json_each(:keys));

-- name: update_run
-- Same rule as PostgreSQL's update_run (and projections.run_index.row_after).
UPDATE steptrail_runs SET
    agent = :agent,
    status = :status,
    version = :version,
    segment = :segment,
    holder = :holder,
    lease_ms = :lease_ms,
    claim_version = :claim_version,
    requeue_count = :requeue_count,
    reason = :reason,
    idempotency_key = :idempotency_key,
    doc = :doc,
    queue = :queue,
    priority = :priority,
    lease_expires_at = CASE WHEN :status = 'running' THEN :at + :lease_ms * 1000 END,
    available_at = CASE
        WHEN :status = 'queued' THEN CASE
            WHEN status = 'queued' THEN available_at
            ELSE :at + :retry_delay_ms * 1000 END
        WHEN :status IN (
            'waiting_for_approval', 'waiting_for_input', 'waiting_for_timer', 'waiting_for_event'
        ) AND :retry_delay_ms >= 0 THEN CASE
            WHEN status = :status AND available_at IS NOT NULL THEN available_at
            ELSE :at + :retry_delay_ms * 1000 END
        END,
    updated_at = :at
WHERE run_id = :run_id;

-- name: update_run_document
-- SQLite only: update_run for an append whose events change no column but the version (a
-- step, a pending-effect marker, a lease renewal, a replay note on a running run;
-- run_index.DOCUMENT_ONLY_EVENTS). Setting only what changes keeps the indexes on the other
-- columns (status, agent, created_at, claimable) out of the commit: SQLite rewrites every
-- index on a column an UPDATE sets, changed or not. The lease restarts from :at, as in
-- update_run. Positional: (version, doc, at, lease_ms, at, run_id).
UPDATE steptrail_runs SET
    version = ?,
    doc = ?,
    lease_expires_at = ? + ? * 1000,
    updated_at = ?
WHERE run_id = ?;

-- name: put_saved
INSERT INTO steptrail_saved (run_id, kind, body) VALUES (:run_id, :kind, :body)
ON CONFLICT (run_id, kind) DO UPDATE SET body = excluded.body;

-- name: drop_saved
DELETE FROM steptrail_saved WHERE run_id = :run_id;

-- name: drop_saved_but_request
-- A run that settles failed keeps its request (and its journal: the caller does not run
-- drop_journal) until it is purged or retried (ADR 0025, ADR 0070); everything else it
-- saved goes, as with any settle.
DELETE FROM steptrail_saved WHERE run_id = :run_id AND kind <> 'request';

-- name: drop_journal
-- SQLite only: settling drops the run's journal in the same transaction (PostgreSQL:
-- steptrail_append). The entries ride in the run's event rows (ADR 0050); with
-- secure_delete the bytes they leave are zeroed.
UPDATE steptrail_events SET journal = NULL
WHERE originator_id = :run_id AND journal IS NOT NULL;

-- name: drop_journal_without_request
-- SQLite only (PostgreSQL: drop_saved_but_request): a run that settles failed keeps its
-- journal exactly when it keeps a request to be retried with (ADR 0070); an interactive
-- run has none, and its journal goes as with any settle. After the append's inserts, so
-- the entries the settling append carried go too.
UPDATE steptrail_events SET journal = NULL
WHERE originator_id = :run_id AND journal IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM steptrail_saved WHERE run_id = :run_id AND kind = 'request');

-- name: drop_journal_from
-- `retry --from N` (ADR 0070): the entries at positions N and later go in the same write
-- transaction as the Retried append, after its events were inserted (the fence: a retry
-- that lost the race failed on the log's unique key and rolls this back). SQLite keeps an
-- entry as a JSON array in its event's row, [seq, position, …] (ADR 0050), stored as a
-- BLOB: read as text for json_extract. A rare operator command: the walk is the run's own
-- range of the log's unique index.
UPDATE steptrail_events SET journal = NULL
WHERE originator_id = :run_id AND journal IS NOT NULL
  AND json_extract(CAST(journal AS TEXT), '$[1]') >= :position;


-- name: claim_queue_after
-- The claim with no queue named (ADR 0077): the next queue after :after (text order) in which
-- the agent has a run the claim may take. One descent of the claim index per queue.
SELECT queue FROM steptrail_runs INDEXED BY steptrail_runs_claim_idx
WHERE agent = :agent AND queue > :after AND available_at IS NOT NULL
  AND concurrency_limit IS NULL
ORDER BY queue
LIMIT 1;

-- name: claim_level_below
-- The highest priority below :below among an (agent, queue)'s runs the claim may take, now
-- or later: the claim walks the levels from the top, one descent each (ADR 0077).
SELECT priority FROM steptrail_runs INDEXED BY steptrail_runs_claim_idx
WHERE agent = :agent AND queue = :queue AND priority < :below AND available_at IS NOT NULL
  AND concurrency_limit IS NULL
ORDER BY priority DESC
LIMIT 1;

-- name: claim
-- Queued runs, and waiting runs whose deadline passed (ADR 0068), of one (agent, queue) at one
-- priority level (ADR 0077). SQLite: the candidates, with their saved requests. Inside the
-- IMMEDIATE transaction nobody else can write; the caller walks the levels from the highest,
-- merges the (agent, queue) pairs' batches, inserts their Claimed events and runs
-- claim_rows, then folds Claimed in Python after the commit, so the write lock is held for
-- SQL work only. The claim index yields a level's rows in claim order and the walk stops
-- after `limit` or at the first run whose time has not come (ADR 0037).
-- INDEXED BY because SQLite never gathers statistics on its own, and without them it could
-- rather read every queued run and sort them than walk this index.
SELECT r.*, s.body AS request
FROM steptrail_runs AS r INDEXED BY steptrail_runs_claim_idx
LEFT JOIN steptrail_saved AS s ON s.run_id = r.run_id AND s.kind = 'request'
WHERE r.agent = :agent AND r.queue = :queue AND r.priority = :priority
  AND r.available_at <= :now AND r.available_at IS NOT NULL AND r.concurrency_limit IS NULL
ORDER BY r.available_at, r.run_id
LIMIT :limit;

-- name: claim_keys_ready
-- Keyed runs (ADR 0078): the keys with a free place and runs to take, least recently served
-- first, with their free places; at most one key per place of the batch.
SELECT key, concurrency_limit - running AS free
FROM steptrail_concurrency_keys INDEXED BY steptrail_concurrency_keys_ready_idx
WHERE pending > 0 AND running < concurrency_limit
ORDER BY last_served, key
LIMIT :limit;

-- name: claim_keyed
-- One key's due runs of the worker's agents and queues (:queues NULL: every queue), in claim
-- order, up to its free places; with their saved requests, as `claim`.
SELECT r.*, s.body AS request
FROM steptrail_runs AS r INDEXED BY steptrail_runs_keyed_idx
LEFT JOIN steptrail_saved AS s ON s.run_id = r.run_id AND s.kind = 'request'
WHERE r.concurrency_key = :key AND r.concurrency_limit IS NOT NULL
  AND r.available_at <= :now AND r.available_at IS NOT NULL
  AND r.agent IN (SELECT value FROM json_each(:agents))
  AND (:queues IS NULL OR r.queue IN (SELECT value FROM json_each(:queues)))
ORDER BY r.priority DESC, r.available_at, r.run_id
LIMIT :limit;

-- name: rotate_key
-- A key that gave the claim nothing (its runs asleep, or of agents and queues the worker
-- does not serve) goes to the back, so the keys behind it are reached.
UPDATE steptrail_concurrency_keys
SET last_served = (SELECT coalesce(max(last_served), 0) + 1 FROM steptrail_concurrency_keys)
WHERE key = :key;

-- name: held_back
-- Whether burst mode must not end yet: a keyed run of these agents and queues is due but not
-- claimed (held back by its key's limit, ADR 0078), or one sleeps on its rate limit's timer
-- (ADR 0080) and wakes by :until (ADR 0083). One statement, two EXISTS, each with the plan
-- it had as a query of its own: the first on the keyed index; the second on the status
-- index (status, agent, ...), so only the agents' timer sleepers are read, and it runs only
-- when the first finds nothing (OR in a WHERE is a jump). The waiting name is compared by
-- prefix with substr, not LIKE (which ignores case in SQLite).
SELECT 1 WHERE EXISTS (
    SELECT 1 FROM steptrail_runs INDEXED BY steptrail_runs_keyed_idx
    WHERE concurrency_limit IS NOT NULL AND available_at IS NOT NULL AND available_at <= :now
      AND agent IN (SELECT value FROM json_each(:agents))
      AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
) OR EXISTS (
    SELECT 1 FROM steptrail_runs
    WHERE agent IN (SELECT value FROM json_each(:agents))
      AND available_at IS NOT NULL AND available_at <= :until
      AND status = 'waiting_for_timer'
      AND substr(json_extract(doc, '$.waiting.name'), 1, 11) = 'rate_limit:'
      AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
);

-- name: claim_rows
-- SQLite only: the Claimed fold as column updates (PostgreSQL's claim does this in its one
-- statement; the rebuild tests hold both to Run.Claimed.apply).
UPDATE steptrail_runs SET
    status = 'running',
    version = version + 1,
    segment = 'worker',
    holder = :holder,
    lease_ms = :lease_ms,
    claim_version = version + 1,
    lease_expires_at = :at + :lease_ms * 1000,
    available_at = NULL,
    updated_at = :at,
    -- Claimed folded from a waiting status (its deadline passed; Run.Claimed.apply).
    doc = CASE WHEN status = 'queued' THEN doc ELSE json_set(
        doc, '$.woke', json(json_extract(doc, '$.waiting')), '$.waiting', NULL,
        '$.wake_after_ms', NULL
    ) END
WHERE run_id = :run_id;
-- name: select_run
SELECT * FROM steptrail_runs WHERE run_id = :run_id;

-- name: select_run_by_key
SELECT * FROM steptrail_runs WHERE idempotency_key = :idempotency_key;

-- name: select_saved
SELECT body FROM steptrail_saved WHERE run_id = :run_id AND kind = :kind;

-- name: select_journal
-- The run's journal entries (ADR 0050: one per event row that carries one), in log order.
SELECT journal FROM steptrail_events
WHERE originator_id = :run_id AND journal IS NOT NULL
ORDER BY originator_version;

-- name: lock_for_reaper
-- PostgreSQL locks its tables here so the reaper's scan queues behind writers in flight; on
-- SQLite the scan runs inside the write transaction (BEGIN IMMEDIATE), which is the same.
SELECT 1;

-- name: select_stale
SELECT * FROM steptrail_runs INDEXED BY steptrail_runs_lease_idx
WHERE status = 'running' AND lease_expires_at < :now
ORDER BY lease_expires_at
LIMIT :limit;
-- name: select_history
SELECT originator_version AS version, recorded_at, topic, state, notification_id
FROM steptrail_events
WHERE originator_id = :run_id
ORDER BY originator_version;

-- name: select_history_page
-- Part of a run's trail (`show`/`audit --from N --limit K`): a range of the primary key.
SELECT originator_version AS version, recorded_at, topic, state, notification_id
FROM steptrail_events
WHERE originator_id = :run_id AND originator_version >= :first
ORDER BY originator_version
LIMIT :limit;

-- name: range_end_runs
-- `verify` and `rebuild run-index` go through the run ids in keyset ranges (ADR 0040): the
-- `skip`+1-th id of the index from `lo` on (an index walk of one range)...
SELECT run_id FROM steptrail_runs WHERE run_id >= :lo ORDER BY run_id LIMIT 1 OFFSET :skip;

-- name: range_end_log
-- ... and the run of the log's `skip`+1-th event from `lo` on, so that a range holds at most
-- that many rows and that many events (plus the rest of its last run's), even where the
-- index and the log disagree.
SELECT originator_id AS run_id FROM steptrail_events
WHERE originator_id >= :lo
ORDER BY originator_id, originator_version LIMIT 1 OFFSET :skip;

-- name: range_runs
SELECT * FROM steptrail_runs WHERE run_id BETWEEN :lo AND :hi ORDER BY run_id;

-- name: range_log
-- The events of one range of runs, run by run, for rebuilding their index rows.
SELECT originator_id AS run_id, originator_version AS version, recorded_at, topic, state
FROM steptrail_events
WHERE originator_id BETWEEN :lo AND :hi
ORDER BY originator_id, originator_version;

-- name: select_runs
-- `steptrail runs` and the inbox: newest first, keyset-paged on (created_at, run_id) below
-- the key given (the first page passes a key above every row). Without a status or an agent
-- the walk is along the creation index (ADR 0042); with one, one of the queries below.
SELECT * FROM steptrail_runs INDEXED BY steptrail_runs_created_idx
WHERE (created_at, run_id) < (:before_at, :before_id)
  AND (:agent IS NULL OR agent = :agent)
  AND (:reason IS NULL OR reason = :reason)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: select_runs_agent
-- One agent's runs, any status: a backward walk of that agent's slice of the agent index
-- (agent, created_at[, run_id]) of migration 0025, which stops after the page however rare
-- the agent is in the history (ADR 0056).
SELECT * FROM steptrail_runs INDEXED BY steptrail_runs_agent_created_idx
WHERE agent = :agent
  AND (created_at, run_id) < (:before_at, :before_id)
  AND (:reason IS NULL OR reason = :reason)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: select_runs_agent_status
-- One agent's runs of one status: a backward walk of that (status, agent) slice of the
-- (status, agent, created_at, run_id) index (migration 0030), which stops after the page
-- however rare the agent is among the runs of that status (ADR 0064).
SELECT * FROM steptrail_runs INDEXED BY steptrail_runs_status_idx
WHERE status = :status AND agent = :agent
  AND (created_at, run_id) < (:before_at, :before_id)
  AND (:reason IS NULL OR reason = :reason)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: select_runs_status
-- A status other than running: a backward walk of that status's slice of the status index
-- (status, created_at[, run_id]) of migration 0017, which stops after the page (ADR 0042).
SELECT * FROM steptrail_runs INDEXED BY steptrail_runs_status_created_idx
WHERE status = :status
  AND (created_at, run_id) < (:before_at, :before_id)
  AND (:agent IS NULL OR agent = :agent)
  AND (:reason IS NULL OR reason = :reason)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: select_runs_running
-- Running runs (as many as workers hold, not the history): read along the lease index, then
-- ordered.
SELECT * FROM steptrail_runs INDEXED BY steptrail_runs_lease_idx
WHERE status = 'running'
  AND (created_at, run_id) < (:before_at, :before_id)
  AND (:agent IS NULL OR agent = :agent)
  AND (:reason IS NULL OR reason = :reason)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: select_failed_runs
-- `steptrail retry --agent/--reason/--since`: failed runs that ended since a time, oldest
-- first, so that a bulk retry goes back on the queue in the order the runs failed.
SELECT run_id FROM steptrail_runs INDEXED BY steptrail_runs_status_idx
WHERE status = 'failed'
  AND (:agent IS NULL OR agent = :agent)
  AND (:reason IS NULL OR reason = :reason)
  AND updated_at >= :since
ORDER BY updated_at, run_id
LIMIT :limit;

-- name: select_all_runs
SELECT * FROM steptrail_runs ORDER BY run_id;

-- name: snapshot_for_verify
-- PostgreSQL sets REPEATABLE READ here; SQLite's read transaction is one WAL snapshot.
SELECT 1;

-- name: delete_range_rows
-- SQLite: a range is rebuilt under the write lock, so its rows are simply replaced.
DELETE FROM steptrail_runs WHERE run_id BETWEEN :lo AND :hi;

-- name: insert_row
INSERT INTO steptrail_runs (
    run_id, agent, status, version, segment, holder, lease_ms, claim_version,
    requeue_count, reason, idempotency_key, doc,
    lease_expires_at, available_at, created_at, updated_at, queue, priority,
    concurrency_key, concurrency_limit, parent_id
) VALUES (
    :run_id, :agent, :status, :version, :segment, :holder, :lease_ms, :claim_version,
    :requeue_count, :reason, :idempotency_key, :doc,
    :lease_expires_at, :available_at, :created_at, :updated_at, :queue, :priority,
    :concurrency_key, :concurrency_limit, :parent_id
);

-- name: store_now
SELECT :now AS now;


-- name: init_tracking
INSERT INTO steptrail_tracking (projection, position) VALUES (:projection, 0)
ON CONFLICT (projection) DO NOTHING;

-- name: lock_tracking
-- SQLite: the IMMEDIATE transaction already excludes other runners.
SELECT position, position_tx, failures, last_error FROM steptrail_tracking
WHERE projection = :projection;
-- name: select_tracking
SELECT position, position_tx, failures, last_error FROM steptrail_tracking
WHERE projection = :projection;
-- name: update_tracking
UPDATE steptrail_tracking SET position = :position, position_tx = :position_tx,
    failures = 0, last_error = NULL
WHERE projection = :projection;
-- name: record_view_failure
INSERT INTO steptrail_tracking (projection, position, failures, last_error)
VALUES (:projection, 0, 1, :error)
ON CONFLICT (projection) DO UPDATE
SET failures = steptrail_tracking.failures + 1, last_error = excluded.last_error;
-- name: select_notifications
-- SQLite writers are serialised, so ids commit in order and the transaction part of the
-- position is always 0; AUTOINCREMENT never reuses an id.
SELECT notification_id, 0 AS tx_id, originator_id AS run_id, originator_version AS version,
       recorded_at, topic, state
FROM steptrail_events
WHERE notification_id > :after
ORDER BY notification_id
LIMIT :limit;
-- name: max_notification_id
SELECT count(*) AS head FROM steptrail_events;
-- name: select_summaries
SELECT * FROM steptrail_view_run_summaries
WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: upsert_summary
INSERT INTO steptrail_view_run_summaries (
    run_id, agent, status, reason, state, steps, step_ms, suspensions,
    created_at, updated_at, ended_at
) VALUES (
    :run_id, :agent, :status, :reason, :state, :steps, :step_ms, :suspensions,
    :created_at, :updated_at, :ended_at
)
ON CONFLICT (run_id) DO UPDATE SET
    agent = excluded.agent, status = excluded.status, reason = excluded.reason,
    state = excluded.state, steps = excluded.steps, step_ms = excluded.step_ms,
    suspensions = excluded.suspensions, created_at = excluded.created_at,
    updated_at = excluded.updated_at, ended_at = excluded.ended_at;

-- name: add_status_count
INSERT INTO steptrail_view_status_counts (agent, status, count)
VALUES (:agent, :status, :delta)
ON CONFLICT (agent, status) DO UPDATE
SET count = steptrail_view_status_counts.count + excluded.count;

-- name: upsert_dead_letter
INSERT INTO steptrail_view_dead_letters (
    run_id, agent, reason, cause, failure_class, error_type, requeue_count, dead_lettered_at
) VALUES (
    :run_id, :agent, :reason, :cause, :failure_class, :error_type, :requeue_count,
    :dead_lettered_at
)
ON CONFLICT (run_id) DO UPDATE SET
    reason = excluded.reason, cause = excluded.cause, failure_class = excluded.failure_class,
    error_type = excluded.error_type, requeue_count = excluded.requeue_count,
    dead_lettered_at = excluded.dead_lettered_at;

-- name: clear_views
DELETE FROM steptrail_view_run_summaries;
DELETE FROM steptrail_view_status_counts;
-- After the summaries: their delete trigger has counted them down, and a count that had
-- drifted is not carried into the rebuilt views (ADR 0042).
DELETE FROM steptrail_view_reason_counts;
DELETE FROM steptrail_view_dead_letters;
UPDATE steptrail_tracking SET position = 0, position_tx = 0 WHERE projection = :projection;
-- name: select_status_counts
SELECT agent, status, count FROM steptrail_view_status_counts WHERE count <> 0
ORDER BY agent, status;

-- name: select_reason_counts
-- Kept by triggers on the summaries (migration 0016, ADR 0042).
SELECT status, reason, count FROM steptrail_view_reason_counts WHERE count <> 0
ORDER BY status, reason;

-- name: select_dead_letters
SELECT * FROM steptrail_view_dead_letters
WHERE (:agent IS NULL OR agent = :agent)
ORDER BY dead_lettered_at DESC, run_id
LIMIT :limit;

-- name: select_all_summaries
SELECT * FROM steptrail_view_run_summaries ORDER BY run_id;

-- name: select_all_dead_letters
SELECT * FROM steptrail_view_dead_letters ORDER BY run_id;

-- name: range_end_summaries
-- `verify` of the views goes through the run ids in keyset ranges too (ADR 0040).
SELECT run_id FROM steptrail_view_run_summaries WHERE run_id >= :lo ORDER BY run_id
LIMIT 1 OFFSET :skip;

-- name: range_summaries
SELECT * FROM steptrail_view_run_summaries WHERE run_id BETWEEN :lo AND :hi
ORDER BY run_id;

-- name: range_dead_letters
SELECT * FROM steptrail_view_dead_letters WHERE run_id BETWEEN :lo AND :hi
ORDER BY run_id;

-- name: range_notifications
-- The events of one range of runs up to a position the views reached, in reading order.
-- Found by the range of run ids, then sorted (the range's events only): `+notification_id`
-- keeps the planner off the rowid, which matched the ORDER BY and made it read every event
-- of the log up to the position, for every range (verify of the views went quadratic).
SELECT notification_id, 0 AS tx_id, originator_id AS run_id, originator_version AS version,
       recorded_at, topic, state
FROM steptrail_events
WHERE originator_id BETWEEN :lo AND :hi AND +notification_id <= :upto
ORDER BY notification_id;

-- name: count_summaries
-- What the status counts must equal: the summaries counted (one pass, constant memory).
SELECT agent, status, count(*) AS count FROM steptrail_view_run_summaries
GROUP BY agent, status ORDER BY agent, status;

-- name: count_reasons
-- What the reason counts (migration 0016, ADR 0042) must equal: the ended summaries counted.
SELECT status, reason, count(*) AS count FROM steptrail_view_run_summaries
WHERE reason IS NOT NULL GROUP BY status, reason ORDER BY status, reason;

-- name: queue_health
-- The stale leases are counted along the lease index (ADR 0037): they cost the stale runs;
-- the oldest queued run is the first entry of the queued-since index (ADR 0042).
SELECT
    (SELECT min(updated_at) FROM steptrail_runs INDEXED BY steptrail_runs_queued_since_idx
     WHERE status = 'queued') AS oldest_queued_at,
    (SELECT count(*) FROM steptrail_runs INDEXED BY steptrail_runs_lease_idx
     WHERE status = 'running' AND lease_expires_at < :now) AS stale_leases,
    :now AS now;

-- name: count_purgeable
-- The runs of one status due for purging, counted along the (status, created_at) index
-- (migration 0017): the window, not the table (ADR 0041).
SELECT count(*) AS n FROM steptrail_runs INDEXED BY steptrail_runs_status_created_idx
WHERE status = :status AND created_at < :cutoff
  AND NOT (status = 'running' AND lease_expires_at >= :now);

-- name: select_live_purgeable
-- Running runs in the window that a worker holds under a live lease: never purged (a write
-- tool in flight would lose its marker), reported as skipped. Asked only of a category that
-- purges running runs.
SELECT run_id FROM steptrail_runs INDEXED BY steptrail_runs_status_created_idx
WHERE status = 'running' AND created_at < :cutoff AND lease_expires_at >= :now
ORDER BY created_at, run_id;

-- name: select_purgeable
-- The oldest runs of one status due for purging, along the (status, created_at) index
-- (migration 0017): the walk stops after the batch, however many runs the database holds
-- (ADR 0041). A run held under a live lease is never purged.
SELECT run_id FROM steptrail_runs INDEXED BY steptrail_runs_status_created_idx
WHERE status = :status AND created_at < :cutoff
  AND NOT (status = 'running' AND lease_expires_at >= :now)
ORDER BY created_at, run_id
LIMIT :limit;

-- name: purge_runs
-- The counts move by the purged summaries' own (agent, status) pairs, found by key: a batch
-- costs its runs, not every summary of those statuses (ADR 0041).
UPDATE steptrail_view_status_counts SET count = count - d.n
FROM (
    SELECT agent, status, count(*) AS n FROM steptrail_view_run_summaries
    WHERE run_id IN (SELECT value FROM json_each(:ids)) GROUP BY agent, status
) AS d
WHERE steptrail_view_status_counts.agent = d.agent
  AND steptrail_view_status_counts.status = d.status;
DELETE FROM steptrail_view_run_summaries WHERE run_id IN (SELECT value FROM json_each(:ids));
DELETE FROM steptrail_view_dead_letters WHERE run_id IN (SELECT value FROM json_each(:ids));
DELETE FROM steptrail_saved WHERE run_id IN (SELECT value FROM json_each(:ids));
DELETE FROM steptrail_signals WHERE run_id IN (SELECT value FROM json_each(:ids));
INSERT INTO steptrail_purged_events (position_tx, position, run_id, version, purged_at)
SELECT 0, notification_id, originator_id, originator_version, :now FROM steptrail_events
WHERE originator_id IN (SELECT value FROM json_each(:ids))
ON CONFLICT DO NOTHING;
DELETE FROM steptrail_events WHERE originator_id IN (SELECT value FROM json_each(:ids));
DELETE FROM steptrail_runs WHERE run_id IN (SELECT value FROM json_each(:ids));
INSERT INTO steptrail_tombstones (run_id, category, purged_at)
SELECT value, :category, :now FROM json_each(:ids) WHERE true
ON CONFLICT (run_id) DO NOTHING;

-- name: select_tombstone
SELECT * FROM steptrail_tombstones WHERE run_id = :run_id;

-- name: after_purge
-- Fold the WAL back into the database so deleted content leaves the WAL file too (the
-- deleted pages themselves are overwritten by secure_delete).
PRAGMA wal_checkpoint(TRUNCATE);

-- name: select_feed
-- The event feed (ADR 0029): the log by id (writers are serialised, so ids commit in order),
-- merged with the positions of purged events. A bare compound SELECT, so that SQLite merges
-- the two arms in index order and stops at the LIMIT instead of sorting the whole tail.
SELECT notification_id, 0 AS tx_id, originator_id AS run_id, originator_version AS version,
       recorded_at, topic, state, NULL AS purged_at
FROM steptrail_events
WHERE notification_id > :after
UNION ALL
SELECT position, position_tx, run_id, version, NULL, NULL, NULL, purged_at
FROM steptrail_purged_events
WHERE position_tx = 0 AND position > :after
ORDER BY notification_id
LIMIT :limit;

-- name: count_after
SELECT count(*) AS n FROM steptrail_events WHERE notification_id > :after;

-- name: select_all_tracking
SELECT projection, position_tx, position FROM steptrail_tracking ORDER BY projection;

-- name: select_failures
SELECT * FROM steptrail_projection_failures ORDER BY projection;

-- name: record_failure
INSERT INTO steptrail_projection_failures (
    projection, position_tx, position, run_id, topic, error, failed_at, attempts
) VALUES (
    :projection, :position_tx, :position, :run_id, :topic, :error, :now, 1
)
ON CONFLICT (projection) DO UPDATE SET
    position_tx = excluded.position_tx, position = excluded.position,
    run_id = excluded.run_id, topic = excluded.topic, error = excluded.error,
    failed_at = excluded.failed_at,
    attempts = steptrail_projection_failures.attempts + 1;

-- name: clear_failure
DELETE FROM steptrail_projection_failures WHERE projection = :projection;

-- name: rewind_tracking
INSERT INTO steptrail_tracking (projection, position) VALUES (:projection, 0)
ON CONFLICT (projection) DO UPDATE SET position = 0, position_tx = 0;
DELETE FROM steptrail_projection_failures WHERE projection = :projection;

-- name: run_head_position
SELECT 0 AS tx_id, notification_id FROM steptrail_events
WHERE originator_id = :run_id
ORDER BY originator_version DESC
LIMIT 1;
-- The console's runs page (ADR 0026): newest first, keyset-paginated on (created_at,
-- run_id) < the last row of the previous page (the first page passes a key above every
-- row), so a page costs the same at the millionth run as at the first. One query per
-- filter that drives the index walk; the other filters are checked on the rows walked.
-- SQLite: INDEXED BY, because it keeps no statistics and might sort instead.

-- name: runs_page_all
SELECT * FROM steptrail_view_run_summaries INDEXED BY steptrail_view_run_summaries_created_idx
WHERE (created_at, run_id) < (:after_at, :after_id)
  AND created_at >= :since
  AND (:status IS NULL OR status = :status)
  AND (:agent IS NULL OR agent = :agent)
  AND (:reason IS NULL OR reason = :reason)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: runs_page_status
SELECT * FROM steptrail_view_run_summaries INDEXED BY steptrail_view_run_summaries_status_created_idx
WHERE status = :status AND (created_at, run_id) < (:after_at, :after_id)
  AND created_at >= :since
  AND (:agent IS NULL OR agent = :agent)
  AND (:reason IS NULL OR reason = :reason)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: runs_page_agent
SELECT * FROM steptrail_view_run_summaries INDEXED BY steptrail_view_run_summaries_agent_created_idx
WHERE agent = :agent AND (created_at, run_id) < (:after_at, :after_id)
  AND created_at >= :since
  AND (:status IS NULL OR status = :status)
  AND (:reason IS NULL OR reason = :reason)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: runs_page_agent_status
SELECT * FROM steptrail_view_run_summaries INDEXED BY steptrail_view_run_summaries_agent_status_created_idx
WHERE agent = :agent AND status = :status AND (created_at, run_id) < (:after_at, :after_id)
  AND created_at >= :since
  AND (:reason IS NULL OR reason = :reason)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: runs_page_reason
SELECT * FROM steptrail_view_run_summaries INDEXED BY steptrail_view_run_summaries_reason_created_idx
WHERE reason = :reason AND (created_at, run_id) < (:after_at, :after_id)
  AND created_at >= :since
  AND (:status IS NULL OR status = :status)
  AND (:agent IS NULL OR agent = :agent)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: dead_letters_open
-- The console's dead letters: those still failed (a retried run leaves this list; its row
-- in the view stays, as the record that it was dead-lettered once).
SELECT d.* FROM steptrail_view_dead_letters AS d
JOIN steptrail_view_run_summaries AS s ON s.run_id = d.run_id AND s.status = 'failed'
WHERE (:agent IS NULL OR d.agent = :agent)
ORDER BY d.dead_lettered_at DESC, d.run_id
LIMIT :limit;

-- name: throughput_by_minute
-- Runs that ended per minute and status since :since (microseconds), for the overview chart.
SELECT ended_at / 60000000 AS minute, status, count(*) AS n
FROM steptrail_view_run_summaries INDEXED BY steptrail_view_run_summaries_ended_idx
WHERE ended_at IS NOT NULL AND ended_at >= :since
GROUP BY minute, status
ORDER BY minute;

-- name: recent_step_durations
-- The newest step records of the log, for the step-duration percentiles: a bounded walk
-- back along the notification id, whatever the log's size.
SELECT recorded_at, state FROM steptrail_events
WHERE topic = 'steptrail.Run.StepRecorded'
ORDER BY notification_id DESC
LIMIT :limit;

-- name: lock_run_row
-- Signals (ADR 0073): the run's version and status, read inside the write transaction (the
-- database's write lock is the row lock PostgreSQL takes).
SELECT version, status FROM steptrail_runs WHERE run_id = :run_id;

-- name: next_signal_seq
SELECT coalesce(max(seq), 0) + 1 AS seq FROM steptrail_signals WHERE run_id = :run_id;

-- name: insert_signal
INSERT INTO steptrail_signals (run_id, seq, name, payload, sent_by, sent_at)
VALUES (:run_id, :seq, :name, :payload, :sent_by, :at);

-- name: select_next_signal
SELECT seq, name, payload FROM steptrail_signals
WHERE run_id = :run_id AND name = :name AND seq > :after
ORDER BY seq
LIMIT 1;

-- name: select_signals
SELECT seq, name, sent_by, sent_at, length(payload) AS size FROM steptrail_signals
WHERE run_id = :run_id ORDER BY seq;

-- name: run_ids_like
-- Short ids (ADR 0074): the runs whose id starts with the digits (a key range of the
-- primary key) or ends with them (what a table shows: a scan of the index's keys, paid
-- only when somebody typed a part of an id), then purged runs' tombstones alike.
SELECT run_id, 0 AS purged FROM (
    SELECT run_id FROM steptrail_runs WHERE run_id BETWEEN :lo AND :hi
    UNION
    SELECT run_id FROM steptrail_runs WHERE run_id LIKE :suffix
)
UNION ALL
SELECT run_id, 1 AS purged FROM (
    SELECT run_id FROM steptrail_tombstones WHERE run_id BETWEEN :lo AND :hi
    UNION
    SELECT run_id FROM steptrail_tombstones WHERE run_id LIKE :suffix
)
ORDER BY purged, run_id
LIMIT :limit;

-- name: select_schedules
-- Schedules (ADR 0076).
SELECT * FROM steptrail_schedules ORDER BY name;

-- name: select_schedule
SELECT * FROM steptrail_schedules WHERE name = :name;

-- name: insert_schedule
INSERT INTO steptrail_schedules (
    name, cron, agent, request, missed, grace_ms, paused, next_tick_at, updated_at, updated_by
) VALUES (
    :name, :cron, :agent, :request, :missed, :grace_ms, 0, :next_tick_at, :at, :by
);

-- name: update_schedule_definition
UPDATE steptrail_schedules SET
    cron = :cron, agent = :agent, request = :request, missed = :missed,
    grace_ms = :grace_ms, next_tick_at = :next_tick_at, updated_at = :at, updated_by = :by
WHERE name = :name;

-- name: due_schedules
SELECT * FROM steptrail_schedules
WHERE paused = 0 AND next_tick_at <= :now
ORDER BY next_tick_at, name
LIMIT :limit;

-- name: advance_schedule
-- A compare-and-set on the next tick: of two schedulers that fired the same ticks (one run
-- each, by their idempotency keys), one moves the schedule on and the other finds it moved.
UPDATE steptrail_schedules SET
    next_tick_at = :next_tick_at,
    last_tick_at = coalesce(:last_tick_at, last_tick_at),
    last_run_id = coalesce(:last_run_id, last_run_id),
    updated_at = :at
WHERE name = :name AND next_tick_at = :expected;

-- name: pause_schedule
UPDATE steptrail_schedules SET paused = :paused, updated_at = :at, updated_by = :by
WHERE name = :name;

-- name: define_rate_limit
-- Rate limits (ADR 0080): the definition in code, stored (or changed) by a worker at its
-- start; a provider's block is kept.
INSERT INTO steptrail_rate_limits (
    name, requests, tokens, per_ms, margin_ms, updated_at, updated_by
) VALUES (:name, :requests, :tokens, :per_ms, :margin_ms, :at, :by)
ON CONFLICT (name) DO UPDATE SET
    requests = excluded.requests, tokens = excluded.tokens, per_ms = excluded.per_ms,
    margin_ms = excluded.margin_ms, updated_at = excluded.updated_at,
    updated_by = excluded.updated_by
WHERE requests IS NOT excluded.requests OR tokens IS NOT excluded.tokens
    OR per_ms <> excluded.per_ms OR margin_ms <> excluded.margin_ms;

-- name: select_rate_limits
-- Each limit with what its window (per + margin, ending now) holds.
SELECT l.*, count(g.id) AS used_requests, coalesce(sum(g.tokens), 0) AS used_tokens
FROM steptrail_rate_limits l
LEFT JOIN steptrail_rate_grants g
    ON g.limit_name = l.name AND g.granted_at > :now - (l.per_ms + l.margin_ms) * 1000
GROUP BY l.name
ORDER BY l.name;

-- name: lock_rate_limit
-- SQLite: the IMMEDIATE write transaction around the acquire is the lock (one writer at a
-- time, in this process and across processes).
SELECT * FROM steptrail_rate_limits WHERE name = :name;

-- name: prune_rate_grants
DELETE FROM steptrail_rate_grants WHERE limit_name = :name AND granted_at <= :now - :window_us;

-- name: window_rate_use
-- What the window ending now holds, in one row: most acquires need no more (ADR 0080).
SELECT :now AS now, count(*) AS grants, coalesce(sum(tokens), 0) AS held
FROM steptrail_rate_grants
WHERE limit_name = :name AND granted_at > :now - :window_us;

-- name: window_rate_grants
-- The grants themselves, oldest first: read only when the use says the acquirer waits.
SELECT granted_at, tokens FROM steptrail_rate_grants
WHERE limit_name = :name AND granted_at > :now - :window_us
ORDER BY granted_at, id;

-- name: insert_rate_grant
INSERT INTO steptrail_rate_grants (limit_name, granted_at, tokens, run_id)
VALUES (:name, :now, :tokens, :run_id)
RETURNING id;

-- name: correct_rate_grant
-- The step reported its real tokens: they replace the estimate in every later decision.
UPDATE steptrail_rate_grants SET tokens = :tokens WHERE id = :id;

-- name: block_rate_limit
-- A provider's Retry-After: no grant before then, for every worker; a later block wins.
UPDATE steptrail_rate_limits
SET blocked_until = max(coalesce(blocked_until, 0), :now + :ms * 1000)
WHERE name = :name;

-- name: select_children
-- A run's child runs, oldest first (ADR 0075): the partial index on parent_id.
SELECT * FROM steptrail_runs WHERE parent_id = :run_id ORDER BY created_at, run_id;

-- name: next_due_at
-- An idle worker's wait (ADR 0082): the earliest available_at of one (agent, queue) at one
-- priority level among the runs without a key; the caller walks the queues and levels as
-- the claim does (sqlite_queues) and takes the least. One descent of the claim index.
SELECT available_at FROM steptrail_runs INDEXED BY steptrail_runs_claim_idx
WHERE agent = :agent AND queue = :queue AND priority = :priority
  AND available_at IS NOT NULL AND concurrency_limit IS NULL
ORDER BY available_at
LIMIT 1;

-- name: keyed_due_queue_after
-- An idle worker's wait for keyed runs (ADR 0087): the next queue after :after (text order)
-- in which the agent has a keyed run with a due time of its own (suspended with a
-- deadline, or requeued: the keyed due index). One descent per queue.
SELECT queue FROM steptrail_runs INDEXED BY steptrail_runs_keyed_due_idx
WHERE agent = :agent AND queue > :after AND available_at IS NOT NULL
  AND concurrency_limit IS NOT NULL
  AND (status <> 'queued' OR requeue_count > 0)
ORDER BY queue
LIMIT 1;

-- name: keyed_next_due_at
-- The earliest due time still to come among an (agent, queue)'s keyed runs: one descent.
SELECT available_at FROM steptrail_runs INDEXED BY steptrail_runs_keyed_due_idx
WHERE agent = :agent AND queue = :queue AND available_at > :now
  AND available_at IS NOT NULL AND concurrency_limit IS NOT NULL
  AND (status <> 'queued' OR requeue_count > 0)
ORDER BY available_at
LIMIT 1;

-- name: keyed_came_due_at
-- The latest due time passed among an (agent, queue)'s :recent latest due keyed runs whose key
-- has a free place (NULL: none): claimable at once. A run held back by its key's limit does
-- not count, so it does not make an idle worker claim again and again (ADR 0087).
SELECT max(c.available_at) FROM (
    SELECT available_at, concurrency_key FROM steptrail_runs
        INDEXED BY steptrail_runs_keyed_due_idx
    WHERE agent = :agent AND queue = :queue AND available_at <= :now
      AND available_at IS NOT NULL AND concurrency_limit IS NOT NULL
  AND (status <> 'queued' OR requeue_count > 0)
    ORDER BY available_at DESC
    LIMIT :recent
) AS c
WHERE EXISTS (
    SELECT 1 FROM steptrail_concurrency_keys AS k
    WHERE k.key = c.concurrency_key AND k.running < k.concurrency_limit
);
