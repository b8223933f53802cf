-- Named queries for PostgreSQL. Every write of the hot path is one statement in autocommit:
-- one network round trip, one commit. Writers of one run queue on its index row; writers of
-- different runs do not wait for each other (ADR 0012).

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

-- name: lock_as_writer
-- A writer that reads before it writes (a rebuild range, ADR 0040; a purge batch, whose row
-- locks are only ROW SHARE) holds ROW EXCLUSIVE on the run index from its first statement,
-- as steptrail_append and steptrail_claim do: the reaper's SHARE lock waits for it as for
-- any writer in flight instead of slipping in between its row locks and its writes, and
-- every writer takes the run index before the log, the reaper's order, so none of them
-- deadlocks with it (ADR 0054).
LOCK TABLE steptrail_runs IN ROW EXCLUSIVE MODE;

-- name: insert_run
-- A new run's row, creation event and saved request, unless its idempotency key is taken:
-- then nothing is inserted and the existing run's row comes back instead (created = false),
-- in the same round trip (ADR 0044). Only when the key was taken by a transaction that
-- committed after this statement began is the existing row invisible here: then no row
-- comes back and the caller reads it with select_run_by_key. A queued run wakes idle
-- workers (NOTIFY is delivered at commit). The instant is read once, after the statement's
-- table locks (clock_timestamp, not the statement's start: ADR 0016), and is the event's
-- recorded_at too, so a rebuilt index equals this row.
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS at
), new_run AS (
    INSERT INTO steptrail_runs (
        run_id, agent, status, version, segment, holder, lease_ms, claim_version,
        requeue_count, reason, idempotency_key, doc,
        lease_expires_at, available_at, created_at, updated_at, queue, priority,
        concurrency_key, concurrency_limit, parent_id
    ) SELECT
        %(run_id)s, %(agent)s, %(status)s, %(version)s, %(segment)s, %(holder)s,
        %(lease_ms)s, %(claim_version)s, %(requeue_count)s, %(reason)s,
        %(idempotency_key)s, %(doc)s,
        CASE WHEN %(status)s = 'running'
            THEN clock.at + %(lease_ms)s::bigint * interval '1 millisecond' END,
        CASE WHEN %(status)s = 'queued'
            THEN clock.at + %(retry_delay_ms)s::bigint * interval '1 millisecond' END,
        clock.at, clock.at, %(queue)s, %(priority)s, %(concurrency_key)s, %(concurrency_limit)s, %(parent_id)s::uuid
    FROM clock
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
), new_event AS (
    INSERT INTO steptrail_events (originator_id, originator_version, topic, state, recorded_at)
    SELECT run_id, 1, %(topic)s, %(state)s, created_at FROM new_run
), new_request AS (
    INSERT INTO steptrail_saved (run_id, kind, body)
    SELECT run_id, 'request', %(request)s::bytea FROM new_run
    WHERE %(request)s::bytea IS NOT NULL
)
SELECT n.*, true AS created,
       CASE WHEN n.status = 'queued' THEN pg_notify('steptrail_queued', n.agent) END AS woken
FROM new_run AS n
UNION ALL
SELECT r.*, false, NULL FROM steptrail_runs AS r
WHERE r.idempotency_key = %(idempotency_key)s::text AND NOT EXISTS (SELECT FROM new_run);
-- name: insert_runs
-- Many new runs in one statement (enqueue_many, ADR 0044): each run's row, creation event and
-- saved request exactly as insert_run writes them, from one array per column, skipping runs
-- whose idempotency key is taken (also by an earlier run of the same batch). Returns a row per
-- run inserted (created) and per taken key whose run this statement can see (not created); a
-- key taken by a transaction that committed after this statement began is in neither, and
-- the caller reads it (select_runs_by_keys). One NOTIFY per agent of the batch, not per run.
-- The batch's concurrency keys' rows are locked first, in key order (`key_rows`; the run
-- index's triggers, which count them, fire at the end of the statement): two batches with
-- keys in opposite orders queue on the first key instead of deadlocking (ADR 0078).
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS at
), given AS (
    SELECT * FROM unnest(
        %(run_ids)s::uuid[], %(agents)s::text[], %(statuses)s::text[], %(versions)s::bigint[],
        %(segments)s::text[], %(holders)s::text[], %(lease_mss)s::bigint[],
        %(claim_versions)s::bigint[], %(requeue_counts)s::integer[], %(reasons)s::text[],
        %(keys)s::text[], %(docs)s::jsonb[], %(retry_delay_mss)s::bigint[],
        %(topics)s::text[], %(states)s::bytea[], %(requests)s::bytea[],
        %(queues)s::text[], %(priorities)s::integer[],
        %(concurrency_keys)s::text[], %(concurrency_limits)s::integer[], %(parent_ids)s::uuid[]
    ) WITH ORDINALITY AS g(
        run_id, agent, status, version, segment, holder, lease_ms, claim_version,
        requeue_count, reason, idempotency_key, doc, retry_delay_ms, topic, state, request,
        queue, priority, concurrency_key, concurrency_limit, parent_id, ord
    )
), key_rows AS (
    INSERT INTO steptrail_concurrency_keys AS k (key, concurrency_limit)
    SELECT DISTINCT ON (g.concurrency_key) g.concurrency_key, g.concurrency_limit
    FROM given AS g WHERE g.concurrency_key IS NOT NULL
    ORDER BY g.concurrency_key, g.ord DESC
    ON CONFLICT (key) DO UPDATE SET concurrency_limit = excluded.concurrency_limit
), new_run AS (
    INSERT INTO steptrail_runs (
        run_id, agent, status, version, segment, holder, lease_ms, claim_version,
        requeue_count, reason, idempotency_key, doc,
        lease_expires_at, available_at, created_at, updated_at, queue, priority,
        concurrency_key, concurrency_limit, parent_id
    ) SELECT
        g.run_id, g.agent, g.status, g.version, g.segment, g.holder, g.lease_ms,
        g.claim_version, g.requeue_count, g.reason, g.idempotency_key, g.doc,
        CASE WHEN g.status = 'running'
            THEN clock.at + g.lease_ms * interval '1 millisecond' END,
        CASE WHEN g.status = 'queued'
            THEN clock.at + g.retry_delay_ms * interval '1 millisecond' END,
        clock.at, clock.at, g.queue, g.priority, g.concurrency_key, g.concurrency_limit, g.parent_id
    FROM given AS g, clock
    ORDER BY g.ord
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING run_id, agent, status, idempotency_key, created_at
), new_event AS (
    INSERT INTO steptrail_events (originator_id, originator_version, topic, state, recorded_at)
    SELECT n.run_id, 1, g.topic, g.state, n.created_at
    FROM new_run AS n JOIN given AS g ON g.run_id = n.run_id
    ORDER BY g.ord
), new_request AS (
    INSERT INTO steptrail_saved (run_id, kind, body)
    SELECT n.run_id, 'request', g.request
    FROM new_run AS n JOIN given AS g ON g.run_id = n.run_id
    WHERE g.request IS NOT NULL
), woken AS (
    SELECT pg_notify('steptrail_queued', a.agent)
    FROM (SELECT DISTINCT agent FROM new_run WHERE status = 'queued') AS a
)
SELECT run_id, idempotency_key, true AS created, (SELECT count(*) FROM woken) AS woken
FROM new_run
UNION ALL
SELECT run_id, idempotency_key, false, 0 FROM steptrail_runs
WHERE idempotency_key = ANY(%(keys)s::text[])
  AND run_id NOT IN (SELECT run_id FROM new_run);

-- name: select_runs_by_keys
SELECT run_id, idempotency_key FROM steptrail_runs
WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: append
-- See steptrail_append (migrations 0005, 0006): take the locks, then read the clock (ADR
-- 0016), check the version (the fence), insert the events and the steps' journal entries,
-- maintain saved state and wake workers; one round trip. The document is passed as JSON text.
SELECT steptrail_append(
    %(run_id)s, %(expected)s, %(versions)s, %(topics)s, %(states)s,
    %(agent)s, %(status)s, %(version)s, %(segment)s, %(holder)s, %(lease_ms)s,
    %(claim_version)s, %(requeue_count)s, %(reason)s, %(idempotency_key)s, %(doc)s::jsonb,
    %(retry_delay_ms)s, %(resumable)s, %(drop_saved)s, %(notify)s,
    %(j_seqs)s::bigint[], %(j_positions)s::integer[], %(j_kinds)s::text[],
    %(j_names)s::text[], %(j_fingerprints)s::text[], %(j_outcomes)s::bytea[]
);

-- name: append_one
-- PostgreSQL only: `append` for the common case, one event and at most one journal entry
-- (every step of a run), with scalar parameters: the server builds the one-element arrays,
-- which costs it nothing, where adapting nine Python lists was the larger part of the
-- client's CPU per append (ADR 0039). No entry: j_seq is NULL, and so is the seqs array,
-- whose cardinality steptrail_append tests.
SELECT steptrail_append(
    %(run_id)s, %(expected)s, ARRAY[%(expected)s::bigint + 1], ARRAY[%(topic)s::text],
    ARRAY[%(state)s::bytea],
    %(agent)s, %(status)s, %(version)s, %(segment)s, %(holder)s, %(lease_ms)s,
    %(claim_version)s, %(requeue_count)s, %(reason)s, %(idempotency_key)s, %(doc)s::jsonb,
    %(retry_delay_ms)s, %(resumable)s, %(drop_saved)s, %(notify)s,
    CASE WHEN %(j_seq)s::bigint IS NOT NULL THEN ARRAY[%(j_seq)s::bigint] END,
    ARRAY[%(j_position)s::integer], ARRAY[%(j_kind)s::text], ARRAY[%(j_name)s::text],
    ARRAY[%(j_fingerprint)s::text], ARRAY[%(j_outcome)s::bytea]
);

-- name: append_two
-- PostgreSQL only: `append_one` for two events and at most one journal entry: a settle that
-- carries the run's last step (every run that records a step settles so; the entry is then
-- dropped, a settle deletes the journal), or a step with the replay note. Scalar parameters
-- for the same reason as `append_one`: adapting the arrays' lists (and escaping each event's
-- JSON into an array literal) cost the client more than the rest of the statement (ADR 0053).
SELECT steptrail_append(
    %(run_id)s, %(expected)s,
    ARRAY[%(expected)s::bigint + 1, %(expected)s::bigint + 2],
    ARRAY[%(topic)s::text, %(topic_2)s::text], ARRAY[%(state)s::bytea, %(state_2)s::bytea],
    %(agent)s, %(status)s, %(version)s, %(segment)s, %(holder)s, %(lease_ms)s,
    %(claim_version)s, %(requeue_count)s, %(reason)s, %(idempotency_key)s, %(doc)s::jsonb,
    %(retry_delay_ms)s, %(resumable)s, %(drop_saved)s, %(notify)s,
    CASE WHEN %(j_seq)s::bigint IS NOT NULL THEN ARRAY[%(j_seq)s::bigint] END,
    ARRAY[%(j_position)s::integer], ARRAY[%(j_kind)s::text], ARRAY[%(j_name)s::text],
    ARRAY[%(j_fingerprint)s::text], ARRAY[%(j_outcome)s::bytea]
);

-- name: drop_saved_but_request
-- A run that settles failed keeps its request and its step journal until it is purged or
-- retried (ADR 0025, ADR 0070): its append passes drop_saved = false (which also spares the
-- journal) and runs this in the same transaction instead, which drops the rest of what
-- steptrail_append's drop_saved would have dropped (the resumable state), and the journal
-- of a run that has no request to be retried with (an interactive run): the journal is
-- kept exactly when the request is.
WITH journal AS (
    DELETE FROM steptrail_journal WHERE run_id = %(run_id)s AND NOT EXISTS (
        SELECT 1 FROM steptrail_saved WHERE run_id = %(run_id)s AND kind = 'request'
    )
)
DELETE FROM steptrail_saved WHERE run_id = %(run_id)s AND kind <> 'request';

-- name: set_priority
-- PostgreSQL: a PriorityChanged append's new priority, in its transaction after
-- steptrail_append took the row's lock and checked the fence (ADR 0077); no other append
-- changes a run's queue or priority, so steptrail_append leaves both columns as they are.
UPDATE steptrail_runs SET priority = %(priority)s WHERE run_id = %(run_id)s;

-- name: drop_journal_from
-- `retry --from N` (ADR 0070): the journal entries at positions N and later go in the same
-- transaction as the Retried append, after it (steptrail_append took the run's row lock and
-- checked the fence; a retry that lost the race raised before this ran), so those steps
-- run again and the ones before replay.
DELETE FROM steptrail_journal WHERE run_id = %(run_id)s AND position >= %(position)s;



-- name: claim
-- Take up to `limit` runs of the queues asked for (NULL: every queue), the highest priority
-- first, then those that became available first (ADR 0077), in one statement: lock their
-- rows (skipping rows other claimers hold), append Claimed at each one's next version, and
-- update the rows to running under the new lease. The row is locked before the log is
-- written, like every writer. The Claimed payload does not depend on the run, so it is
-- serialised by the caller; the column updates are the Claimed fold (Run.Claimed.apply),
-- which the rebuild tests check.
--
-- Two instants, on purpose (ADR 0016). Which runs are available is judged at the
-- transaction's start (now()); the lease starts at clock_timestamp(), read once when the
-- claim first needs it, which is after every table lock it takes, and SKIP LOCKED never
-- waits on a row: a claim that queued behind a rebuild still gets a whole lease. Judging
-- availability at the start is also what keeps a multi-row claim's events in reading order
-- (ADR 0018): a row re-checked after somebody changed it passes only if it is still queued
-- and was available before this claim began, and every change to a queued run either leaves
-- it not queued or makes it available later than that.
-- steptrail_claim (migration 0018) does all of it in one statement, so the lock pass and the
-- writes share one snapshot (ADR 0048), and walks the per-agent claim index whatever the
-- statistics say (ADR 0037).
--
-- A claimed run that has recorded steps comes with its journal (ADR 0086), as parallel
-- arrays in step order: the segment would read it first thing, one more round trip per
-- resumed segment. steptrail_claimed_journal (migration 0039) reads it with a snapshot
-- taken after the claim's locks; a fresh run (no steps) costs it no lookup.
SELECT (c.run).*, c.request, j.*
FROM steptrail_claim(
    %(agents)s::text[], %(limit)s::integer, %(topic)s::text, %(state)s::bytea, %(holder)s::text,
    %(lease_ms)s::bigint, %(queues)s::text[]
) AS c
CROSS JOIN LATERAL steptrail_claimed_journal(
    (c.run).run_id, ((c.run).doc ->> 'steps')::bigint
) AS j
ORDER BY (c.run).run_id;
-- name: held_back
-- Whether burst mode must not end yet: a keyed run of these agents and queues is due but not
-- claimed (held back by its key's limit, ADR 0078), or one sleeps on its rate limit's timer
-- (ADR 0080) and wakes within %(horizon_us)s microseconds (ADR 0083). One statement, two
-- uncorrelated EXISTS: each an InitPlan with the plan it had as a query of its own, run
-- when the OR first needs it, so the second only when the first finds nothing.
SELECT 1 AS held WHERE EXISTS (
    SELECT 1 FROM steptrail_runs
    WHERE concurrency_limit IS NOT NULL AND available_at IS NOT NULL AND available_at <= now()
      AND agent = ANY(%(agents)s::text[])
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
) OR EXISTS (
    SELECT 1 FROM steptrail_runs
    WHERE agent = ANY(%(agents)s::text[])
      AND available_at IS NOT NULL
      AND available_at <= now() + %(horizon_us)s::bigint * interval '1 microsecond'
      AND status = 'waiting_for_timer'
      AND left(doc -> 'waiting' ->> 'name', 11) = 'rate_limit:'
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
);

-- name: select_run
SELECT * FROM steptrail_runs WHERE run_id = %(run_id)s;

-- name: select_run_by_key
SELECT * FROM steptrail_runs WHERE idempotency_key = %(idempotency_key)s;

-- name: select_saved
SELECT body FROM steptrail_saved WHERE run_id = %(run_id)s AND kind = %(kind)s;

-- name: select_journal
-- A segment reads its run's whole journal once, before it calls the agent (ADR 0013).
SELECT seq, position, kind, name, fingerprint, outcome FROM steptrail_journal
WHERE run_id = %(run_id)s ORDER BY seq;

-- name: lock_for_reaper
-- The reaper judges staleness only after every write already queued has landed (ADR 0016).
-- SHARE conflicts with the ROW EXCLUSIVE every writer holds from its first statement: the
-- scan waits for writers in flight, and a renewal that sat behind a rebuild or a LOCK TABLE
-- is ahead of the reaper in the lock queue, so it commits its new lease before the reaper
-- looks. Held for the scan only (milliseconds); new writers wait that long.
LOCK TABLE steptrail_runs, steptrail_events IN SHARE MODE;

-- name: select_stale
-- Only running runs whose lease expired by the store's clock, oldest deadline first (to
-- half a lease: the walk is along lease_due_at, the expiry rounded down to half a lease,
-- which a step leaves unchanged; migration 0029, ADR 0063); that partial index makes this
-- proportional to the stale runs returned, and steptrail_stale (migration 0010) walks only
-- that index, whatever the statistics say (ADR 0037). Leases are judged at now(), the
-- transaction's start, just before lock_for_reaper asked for its lock (migration 0019, ADR
-- 0049): a renewal queued behind the same lock after the reaper was sent while its lease
-- still ran, and is not judged by a clock that moved on while it waited. now() is stable,
-- so the lease index can answer the comparison.
SELECT * FROM steptrail_stale(%(limit)s::integer);

-- name: select_history
SELECT originator_version AS version, recorded_at, topic, state, notification_id
FROM steptrail_events
WHERE originator_id = %(run_id)s
ORDER BY originator_version;

-- name: select_history_page
-- Part of a run's trail (`show`/`audit --from N --limit K`): a range of the primary key.
SELECT originator_version AS version, recorded_at, topic, state, notification_id
FROM steptrail_events
WHERE originator_id = %(run_id)s AND originator_version >= %(first)s
ORDER BY originator_version
LIMIT %(limit)s;

-- name: range_end_runs
-- `verify` and `rebuild run-index` go through the run ids in keyset ranges (ADR 0040): the
-- `skip`+1-th id of the index from `lo` on (a walk of the primary key of one range)...
SELECT run_id FROM steptrail_runs WHERE run_id >= %(lo)s ORDER BY run_id
LIMIT 1 OFFSET %(skip)s;

-- name: range_end_log
-- ... and the run of the log's `skip`+1-th event from `lo` on, so that a range holds at most
-- that many rows and that many events (plus the rest of its last run's), even where the
-- index and the log disagree.
SELECT originator_id AS run_id FROM steptrail_events
WHERE originator_id >= %(lo)s
ORDER BY originator_id, originator_version LIMIT 1 OFFSET %(skip)s;

-- name: range_runs
SELECT * FROM steptrail_runs WHERE run_id BETWEEN %(lo)s AND %(hi)s ORDER BY run_id;

-- name: range_log
-- The events of one range of runs, run by run, for rebuilding their index rows.
SELECT originator_id AS run_id, originator_version AS version, recorded_at, topic, state
FROM steptrail_events
WHERE originator_id BETWEEN %(lo)s AND %(hi)s
ORDER BY originator_id, originator_version;

-- name: select_runs
-- The inbox and `steptrail runs`: newest first, keyset-paged on (created_at, run_id) below
-- the key given (the first page passes a key above every row). Without a status or an agent
-- the walk is along the creation index (ADR 0042); with one, one of the queries below.
SELECT * FROM steptrail_runs
WHERE (created_at, run_id) < (%(before_at)s, %(before_id)s)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: select_runs_agent
-- One agent's runs, any status: a backward walk of that agent's slice of the agent index
-- (agent, created_at, run_id) of migration 0025, which stops after the page however rare
-- the agent is in the history (ADR 0056).
SELECT * FROM steptrail_runs
WHERE agent = %(agent)s
  AND (created_at, run_id) < (%(before_at)s, %(before_id)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: select_runs_agent_status
-- One agent's runs of one status: a backward walk of that (status, agent) slice of the
-- (status, agent, created_at, run_id) index (migration 0030), which stops after the page
-- however rare the agent is among the runs of that status (ADR 0064).
SELECT * FROM steptrail_runs
WHERE status = %(status)s AND agent = %(agent)s
  AND (created_at, run_id) < (%(before_at)s, %(before_id)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: select_runs_status
-- A status other than running: a backward walk of that status's slice of the status index
-- (status, created_at, run_id) of migration 0017, which stops after the page (ADR 0042).
SELECT * FROM steptrail_runs
WHERE status = %(status)s
  AND (created_at, run_id) < (%(before_at)s, %(before_id)s)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: select_runs_running
-- Running runs (as many as workers hold, not the history), then ordered.
SELECT * FROM steptrail_runs
WHERE status = 'running'
  AND (created_at, run_id) < (%(before_at)s, %(before_id)s)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: select_failed_runs
-- `steptrail retry --agent/--reason/--since`: failed runs that ended since a time, oldest
-- first, so that a bulk retry goes back on the queue in the order the runs failed.
SELECT run_id FROM steptrail_runs
WHERE status = 'failed'
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
  AND updated_at >= %(since)s
ORDER BY updated_at, run_id
LIMIT %(limit)s;

-- name: select_all_runs
SELECT * FROM steptrail_runs ORDER BY run_id;

-- name: snapshot_for_verify
-- `verify` compares the index with the log: both must come from one snapshot, or a write
-- landing between the two reads looks like drift. First statement of its transaction.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: lock_range
-- PostgreSQL: the index rows of one range, locked in id order before its log is read
-- (ADR 0040). Every writer of a run takes its row before it writes the log, so until this
-- transaction ends no append, claim or purge can change what the range's log says: an
-- append waits here, then finds the version it expects; a claim skips these rows. Runs
-- enqueued into the range meanwhile are not locked, and are left as their enqueue wrote
-- them (insert_missing_row).
SELECT run_id FROM steptrail_runs WHERE run_id BETWEEN %(lo)s AND %(hi)s
ORDER BY run_id FOR UPDATE;

-- name: delete_rows
-- PostgreSQL: locked rows of runs the log does not hold.
DELETE FROM steptrail_runs WHERE run_id = ANY(%(ids)s::uuid[]);

-- name: upsert_row
-- PostgreSQL: a locked row (or one that was missing), replaced by its rebuild, only where
-- they differ: a row equal to its rebuild (every row of a healthy index) is left as it is,
-- so a rebuild writes no new row version, no index entries and no WAL for it, and leaves no
-- dead rows behind for VACUUM (ADR 0062).
INSERT INTO steptrail_runs (
    run_id, agent, status, version, segment, holder, lease_ms, claim_version,
    requeue_count, reason, idempotency_key, doc,
    lease_expires_at, available_at, created_at, updated_at, queue, priority,
    concurrency_key, concurrency_limit, parent_id
) VALUES (
    %(run_id)s, %(agent)s, %(status)s, %(version)s, %(segment)s, %(holder)s,
    %(lease_ms)s, %(claim_version)s, %(requeue_count)s, %(reason)s,
    %(idempotency_key)s, %(doc)s,
    %(lease_expires_at)s, %(available_at)s, %(created_at)s, %(updated_at)s,
    %(queue)s, %(priority)s, %(concurrency_key)s, %(concurrency_limit)s, %(parent_id)s::uuid
)
ON CONFLICT (run_id) DO UPDATE SET
    agent = excluded.agent, status = excluded.status, version = excluded.version,
    segment = excluded.segment, holder = excluded.holder, lease_ms = excluded.lease_ms,
    claim_version = excluded.claim_version, requeue_count = excluded.requeue_count,
    reason = excluded.reason, idempotency_key = excluded.idempotency_key, doc = excluded.doc,
    lease_expires_at = excluded.lease_expires_at, available_at = excluded.available_at,
    created_at = excluded.created_at, updated_at = excluded.updated_at,
    queue = excluded.queue, priority = excluded.priority,
    concurrency_key = excluded.concurrency_key, concurrency_limit = excluded.concurrency_limit,
    parent_id = excluded.parent_id
WHERE (
    steptrail_runs.agent, steptrail_runs.status, steptrail_runs.version,
    steptrail_runs.segment, steptrail_runs.holder, steptrail_runs.lease_ms,
    steptrail_runs.claim_version, steptrail_runs.requeue_count, steptrail_runs.reason,
    steptrail_runs.idempotency_key, steptrail_runs.doc, steptrail_runs.lease_expires_at,
    steptrail_runs.available_at, steptrail_runs.created_at, steptrail_runs.updated_at,
    steptrail_runs.queue, steptrail_runs.priority, steptrail_runs.concurrency_key,
    steptrail_runs.concurrency_limit
) IS DISTINCT FROM (
    excluded.agent, excluded.status, excluded.version, excluded.segment, excluded.holder,
    excluded.lease_ms, excluded.claim_version, excluded.requeue_count, excluded.reason,
    excluded.idempotency_key, excluded.doc, excluded.lease_expires_at, excluded.available_at,
    excluded.created_at, excluded.updated_at, excluded.queue, excluded.priority,
    excluded.concurrency_key, excluded.concurrency_limit
);

-- name: insert_missing_row
-- PostgreSQL: the row of a run in the range's log that was not in the index when the range
-- was locked. Either the index had lost it (inserted here), or the run was enqueued after
-- the lock: then its enqueue wrote the row with its event, a worker may have claimed it
-- since, and that row stands.
INSERT INTO steptrail_runs (
    run_id, agent, status, version, segment, holder, lease_ms, claim_version,
    requeue_count, reason, idempotency_key, doc,
    lease_expires_at, available_at, created_at, updated_at, queue, priority,
    concurrency_key, concurrency_limit, parent_id
) VALUES (
    %(run_id)s, %(agent)s, %(status)s, %(version)s, %(segment)s, %(holder)s,
    %(lease_ms)s, %(claim_version)s, %(requeue_count)s, %(reason)s,
    %(idempotency_key)s, %(doc)s,
    %(lease_expires_at)s, %(available_at)s, %(created_at)s, %(updated_at)s,
    %(queue)s, %(priority)s, %(concurrency_key)s, %(concurrency_limit)s, %(parent_id)s::uuid
)
ON CONFLICT (run_id) DO NOTHING;

-- name: copy_events
-- bulk_load_settled (benchmark databases only, ADR 0044): whole logs of settled runs.
COPY steptrail_events (originator_id, originator_version, topic, state, recorded_at) FROM STDIN;

-- name: copy_runs
-- bulk_load_settled: their index rows, as rebuild folds them (upsert_row's columns).
COPY steptrail_runs (
    run_id, agent, status, version, segment, holder, lease_ms, claim_version,
    requeue_count, reason, idempotency_key, doc,
    lease_expires_at, available_at, created_at, updated_at, queue, priority,
    concurrency_key, concurrency_limit
) FROM STDIN;

-- name: copy_saved
-- bulk_load_settled: the requests failed runs keep (ADR 0025).
COPY steptrail_saved (run_id, kind, body) FROM STDIN;

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
SELECT position, position_tx FROM steptrail_tracking
WHERE projection = %(projection)s FOR UPDATE;
-- name: select_tracking
SELECT position, position_tx, failures, last_error FROM steptrail_tracking
WHERE projection = %(projection)s;
-- name: update_tracking
UPDATE steptrail_tracking SET position = %(position)s, position_tx = %(position_tx)s,
    failures = 0, last_error = NULL
WHERE projection = %(projection)s;
-- name: record_view_failure
-- A batch that failed (rolled back) is counted here in a transaction of its own, so an
-- operator sees a runner that keeps failing (`steptrail stats`, metrics); the next batch that
-- commits clears it.
INSERT INTO steptrail_tracking (projection, position, failures, last_error)
VALUES (%(projection)s, 0, 1, %(error)s)
ON CONFLICT (projection) DO UPDATE
SET failures = steptrail_tracking.failures + 1, last_error = EXCLUDED.last_error;
-- name: select_notifications
-- The log in commit-safe order (ADR 0012). Without a global lock a lower notification id can
-- commit after a higher one, so the log is read by (inserting transaction, id), and only
-- transactions older than the oldest one still running: none of those can still add a row,
-- and every later transaction sorts after them. Gaps (rolled-back or purged ids) are passed.
-- "Still running" counts only this database's writers of the log (ADR 0047).
WITH horizon AS MATERIALIZED (SELECT steptrail_log_horizon() AS tx)
SELECT notification_id, tx_id, originator_id AS run_id, originator_version AS version,
       recorded_at, topic, state
FROM steptrail_events
WHERE (tx_id, notification_id) > (%(after_tx)s::bigint, %(after)s::bigint)
  AND tx_id < (SELECT tx FROM horizon)
ORDER BY tx_id, notification_id
LIMIT %(limit)s;
-- name: max_notification_id
SELECT count(*) AS head FROM steptrail_events;
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
-- After the summaries: their delete trigger has counted them down, and a count that had
-- drifted is not carried into the rebuilt views (ADR 0042).
DELETE FROM steptrail_view_reason_counts;
DELETE FROM steptrail_view_dead_letters;
UPDATE steptrail_tracking SET position = 0, position_tx = 0 WHERE projection = %(projection)s;
-- name: select_status_counts
SELECT agent, status, count FROM steptrail_view_status_counts WHERE count <> 0
ORDER BY agent, status;

-- name: select_reason_counts
-- Kept by a trigger on the summaries (migration 0016, ADR 0042).
SELECT status, reason, count FROM steptrail_view_reason_counts WHERE count <> 0
ORDER BY status, reason;

-- name: select_dead_letters
SELECT * FROM steptrail_view_dead_letters
WHERE (%(agent)s::text IS NULL OR agent = %(agent)s)
ORDER BY dead_lettered_at DESC, run_id
LIMIT %(limit)s;

-- name: select_all_summaries
SELECT * FROM steptrail_view_run_summaries ORDER BY run_id;

-- name: select_all_dead_letters
SELECT * FROM steptrail_view_dead_letters ORDER BY run_id;

-- name: range_end_summaries
-- `verify` of the views goes through the run ids in keyset ranges too (ADR 0040).
SELECT run_id FROM steptrail_view_run_summaries WHERE run_id >= %(lo)s ORDER BY run_id
LIMIT 1 OFFSET %(skip)s;

-- name: range_summaries
SELECT * FROM steptrail_view_run_summaries WHERE run_id BETWEEN %(lo)s AND %(hi)s
ORDER BY run_id;

-- name: range_dead_letters
SELECT * FROM steptrail_view_dead_letters WHERE run_id BETWEEN %(lo)s AND %(hi)s
ORDER BY run_id;

-- name: range_notifications
-- The events of one range of runs up to a position the views reached, in reading order.
SELECT notification_id, tx_id, originator_id AS run_id, originator_version AS version,
       recorded_at, topic, state
FROM steptrail_events
WHERE originator_id BETWEEN %(lo)s AND %(hi)s
  AND (tx_id, notification_id) <= (%(upto_tx)s::bigint, %(upto)s::bigint)
ORDER BY tx_id, notification_id;

-- name: count_summaries
-- What the status counts must equal: the summaries counted (one pass, constant memory).
SELECT agent, status, count(*) AS count FROM steptrail_view_run_summaries
GROUP BY agent, status ORDER BY agent, status;

-- name: count_reasons
-- What the reason counts (migration 0016, ADR 0042) must equal: the ended summaries counted.
SELECT status, reason, count(*) AS count FROM steptrail_view_run_summaries
WHERE reason IS NOT NULL GROUP BY status, reason ORDER BY status, reason;

-- name: queue_health
-- Live figures from the run index (not a view): the oldest queued run (the first entry of
-- the queued-since index, ADR 0042, on queued_at since migration 0029) and expired leases
-- (counted along the lease index by steptrail_stale_count, ADR 0037).
SELECT
    steptrail_oldest_queued() AS oldest_queued_at,
    steptrail_stale_count() AS stale_leases,
    now() AS now;

-- name: count_purgeable
-- The runs of one status due for purging, counted along the (status, created_at, run_id)
-- index (migration 0017): the window, not the table (ADR 0041).
SELECT count(*) AS n FROM steptrail_runs
WHERE status = %(status)s AND created_at < %(cutoff)s
  AND NOT (status = 'running' AND lease_expires_at >= now());

-- name: select_live_purgeable
-- Running runs in the window that a worker holds under a live lease: never purged (a write
-- tool in flight would lose its marker), reported as skipped. Asked only of a category that
-- purges running runs.
SELECT run_id FROM steptrail_runs
WHERE status = 'running' AND created_at < %(cutoff)s AND lease_expires_at >= now()
ORDER BY status, created_at, run_id;

-- name: select_purgeable
-- The oldest runs of one status due for purging, along the (status, created_at, run_id)
-- index (migration 0017), so the walk stops after the batch whatever the database holds
-- (ADR 0041). Each row locked: a writer of one of these runs waits, then finds it gone
-- (its append fails like any fenced append). A row whose status changed meanwhile is
-- re-checked against the condition and skipped if it no longer matches. A run held under a
-- live lease is never purged: a renewal that landed while we waited for the row makes the
-- re-check fail.
SELECT run_id FROM steptrail_runs
WHERE status = %(status)s AND created_at < %(cutoff)s
  AND NOT (status = 'running' AND lease_expires_at >= now())
ORDER BY status, created_at, run_id
LIMIT %(limit)s
FOR UPDATE;
-- name: purge_runs
-- Everything that holds anything of these runs, in one transaction: the views (counts first,
-- from the summaries the views themselves hold), the saved state, the log, the index; then
-- the tombstones, and where each purged event stood in the log (for the feed, ADR 0029). The
-- caller holds the runs' rows and the reporting runner's tracking row.
UPDATE steptrail_view_status_counts AS c SET count = c.count - d.n
FROM (
    SELECT agent, status, count(*) AS n FROM steptrail_view_run_summaries
    WHERE run_id = ANY(%(ids)s::uuid[]) GROUP BY agent, status
) AS d
WHERE c.agent = d.agent AND c.status = d.status;
DELETE FROM steptrail_view_run_summaries WHERE run_id = ANY(%(ids)s::uuid[]);
DELETE FROM steptrail_view_dead_letters WHERE run_id = ANY(%(ids)s::uuid[]);
DELETE FROM steptrail_saved WHERE run_id = ANY(%(ids)s::uuid[]);
DELETE FROM steptrail_journal WHERE run_id = ANY(%(ids)s::uuid[]);
DELETE FROM steptrail_signals WHERE run_id = ANY(%(ids)s::uuid[]);
INSERT INTO steptrail_purged_events (position_tx, position, run_id, version, purged_at)
SELECT tx_id, notification_id, originator_id, originator_version, now() FROM steptrail_events
WHERE originator_id = ANY(%(ids)s::uuid[])
ON CONFLICT DO NOTHING;
DELETE FROM steptrail_events WHERE originator_id = ANY(%(ids)s::uuid[]);
DELETE FROM steptrail_runs WHERE run_id = ANY(%(ids)s::uuid[]);
INSERT INTO steptrail_tombstones (run_id, category, purged_at)
SELECT id, %(category)s, now() FROM unnest(%(ids)s::uuid[]) AS id
ON CONFLICT (run_id) DO NOTHING;

-- name: select_tombstone
SELECT * FROM steptrail_tombstones WHERE run_id = %(run_id)s;

-- name: vacuum_memory
-- The maintenance_work_mem for after_purge's VACUUM (ADR 0065), in kB: room for the dead row
-- pointers it will find (6 bytes each, a quarter more) and no more. VACUUM allocates its
-- whole array of them up front, sized by maintenance_work_mem capped by the table's pages;
-- at a million runs that was 64 MB per table, and the kernel's work of mapping it was
-- nearly all of the VACUUM. What it finds: the rows the purge deleted (counted by the
-- purge) and the dead rows the statistics know of (other writes' churn). Never below
-- PostgreSQL's minimum (1 MB), never above the session's own setting: an estimate that
-- falls short costs VACUUM one more pass over the indexes, not a wrong result.
SELECT LEAST(
    s.setting::bigint,
    GREATEST(1024, ceil((%(dead)s + coalesce(d.n, 0)) * 6 * 1.25 / 1024)::bigint + 64)
) AS kb
FROM pg_settings AS s,
     (SELECT max(n_dead_tup) AS n FROM pg_stat_user_tables
      WHERE schemaname = current_schema() AND relname IN (
          'steptrail_events', 'steptrail_runs', 'steptrail_saved',
          'steptrail_view_run_summaries', 'steptrail_view_dead_letters')) AS d
WHERE s.name = 'maintenance_work_mem';

-- name: set_vacuum_memory
SELECT set_config('maintenance_work_mem', %(kb)s || 'kB', false);

-- name: reset_vacuum_memory
RESET maintenance_work_mem;

-- name: after_purge
-- Deleted rows stay in the table files until VACUUM marks their space reusable; do it now
-- for the tables a purge touches (plain VACUUM: writers are not blocked). It cannot run in a
-- transaction, so it runs on an autocommit connection. Old row versions may also stay in
-- the WAL and its archives; see README "Retention" for what an operator must do.
VACUUM steptrail_events, steptrail_runs, steptrail_saved,
    steptrail_view_run_summaries, steptrail_view_dead_letters;

-- name: select_feed
-- The event feed (ADR 0029): the log in the views' order and under their visibility rule
-- (select_notifications), merged with the positions of purged events, so a consumer passing
-- a purged position is told so. One statement, so one snapshot: a purge committing meanwhile
-- shows each position either as its event or as its marker, never neither. Each arm takes
-- its first `limit` rows by index, so only 2 x limit rows are ever sorted. Both arms use the
-- one horizon (ADR 0047), read once.
WITH horizon AS MATERIALIZED (SELECT steptrail_log_horizon() AS tx)
(SELECT notification_id, tx_id, originator_id AS run_id, originator_version AS version,
        recorded_at, topic, state, NULL::timestamptz AS purged_at
 FROM steptrail_events
 WHERE (tx_id, notification_id) > (%(after_tx)s::bigint, %(after)s::bigint)
   AND tx_id < (SELECT tx FROM horizon)
 ORDER BY tx_id, notification_id
 LIMIT %(limit)s)
UNION ALL
(SELECT position, position_tx, run_id, version, NULL, NULL, NULL, purged_at
 FROM steptrail_purged_events
 WHERE (position_tx, position) > (%(after_tx)s::bigint, %(after)s::bigint)
   AND position_tx < (SELECT tx FROM horizon)
 ORDER BY position_tx, position
 LIMIT %(limit)s)
ORDER BY tx_id, notification_id
LIMIT %(limit)s;

-- name: count_after
-- How far a reader at this position is behind the log (the lag metric).
SELECT count(*) AS n FROM steptrail_events
WHERE (tx_id, notification_id) > (%(after_tx)s::bigint, %(after)s::bigint);

-- name: select_all_tracking
SELECT projection, position_tx, position FROM steptrail_tracking ORDER BY projection;

-- name: select_failures
SELECT * FROM steptrail_projection_failures ORDER BY projection;

-- name: record_failure
-- A projection's batch raised (and rolled back); its position is where it stands still.
INSERT INTO steptrail_projection_failures AS f (
    projection, position_tx, position, run_id, topic, error, failed_at, attempts
) VALUES (
    %(projection)s, %(position_tx)s, %(position)s, %(run_id)s, %(topic)s, %(error)s, now(), 1
)
ON CONFLICT (projection) DO UPDATE SET
    position_tx = EXCLUDED.position_tx, position = EXCLUDED.position,
    run_id = EXCLUDED.run_id, topic = EXCLUDED.topic, error = EXCLUDED.error,
    failed_at = EXCLUDED.failed_at, attempts = f.attempts + 1;

-- name: clear_failure
DELETE FROM steptrail_projection_failures WHERE projection = %(projection)s;

-- name: rewind_tracking
-- A user projection's rebuild: back to the start, failure forgotten (its tables are dropped
-- and created again in the same transaction).
INSERT INTO steptrail_tracking (projection, position) VALUES (%(projection)s, 0)
ON CONFLICT (projection) DO UPDATE SET position = 0, position_tx = 0;
DELETE FROM steptrail_projection_failures WHERE projection = %(projection)s;

-- name: run_head_position
-- Where a run's latest event stands in the log (for waiting until a projection has it).
SELECT tx_id, notification_id FROM steptrail_events
WHERE originator_id = %(run_id)s
ORDER BY originator_version DESC
LIMIT 1;
-- The console's runs page (ADR 0026): newest first, keyset-paginated on (created_at,
-- run_id) < the last row of the previous page (the first page passes a key above every
-- row), so a page costs the same at the millionth run as at the first. One query per
-- filter that drives the index walk; the other filters are checked on the rows walked.

-- name: runs_page_all
SELECT * FROM steptrail_view_run_summaries
WHERE (created_at, run_id) < (%(after_at)s, %(after_id)s)
  AND created_at >= %(since)s
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: runs_page_status
SELECT * FROM steptrail_view_run_summaries
WHERE status = %(status)s AND (created_at, run_id) < (%(after_at)s, %(after_id)s)
  AND created_at >= %(since)s
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: runs_page_agent
SELECT * FROM steptrail_view_run_summaries
WHERE agent = %(agent)s AND (created_at, run_id) < (%(after_at)s, %(after_id)s)
  AND created_at >= %(since)s
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: runs_page_agent_status
SELECT * FROM steptrail_view_run_summaries
WHERE agent = %(agent)s AND status = %(status)s AND (created_at, run_id) < (%(after_at)s, %(after_id)s)
  AND created_at >= %(since)s
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: runs_page_reason
SELECT * FROM steptrail_view_run_summaries
WHERE reason = %(reason)s AND (created_at, run_id) < (%(after_at)s, %(after_id)s)
  AND created_at >= %(since)s
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: dead_letters_open
-- The console's dead letters: those still failed (a retried run leaves this list; its row
-- in the view stays, as the record that it was dead-lettered once).
SELECT d.* FROM steptrail_view_dead_letters AS d
JOIN steptrail_view_run_summaries AS s ON s.run_id = d.run_id AND s.status = 'failed'
WHERE (%(agent)s::text IS NULL OR d.agent = %(agent)s)
ORDER BY d.dead_lettered_at DESC, d.run_id
LIMIT %(limit)s;

-- name: throughput_by_minute
-- Runs that ended per minute and status since %(since)s, for the overview chart.
SELECT floor(extract(epoch FROM ended_at) / 60)::bigint AS minute, status, count(*) AS n
FROM steptrail_view_run_summaries
WHERE ended_at IS NOT NULL AND ended_at >= %(since)s
GROUP BY minute, status
ORDER BY minute;

-- name: recent_step_durations
-- The newest step records of the log, for the step-duration percentiles: a bounded walk
-- back along the notification id, whatever the log's size.
SELECT recorded_at, state FROM steptrail_events
WHERE topic = 'steptrail.Run.StepRecorded'
ORDER BY notification_id DESC
LIMIT %(limit)s;

-- name: restored_positions
-- A database restored from a dump onto another server (pg_dump/pg_restore, a move to a
-- managed service) keeps the old server's transaction ids in the log's positions. Ids at or
-- past this server's next one are from the future: the feed (which reads only transactions
-- older than the oldest running one) would not see those events until the server's counter
-- passed them, and would then order new events before them (ADR 0046). Returns how many
-- distinct positive positions the log holds (the renumbering needs that many ids below
-- the next one) and whether any is from the future. Cheap: index ranges from the top.
SELECT
    pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_tx,
    EXISTS (
        SELECT 1 FROM steptrail_events
        WHERE tx_id >= pg_snapshot_xmax(pg_current_snapshot())::text::bigint
    ) OR EXISTS (
        SELECT 1 FROM steptrail_purged_events
        WHERE position_tx >= pg_snapshot_xmax(pg_current_snapshot())::text::bigint
    ) OR EXISTS (
        SELECT 1 FROM steptrail_tracking
        WHERE position_tx >= pg_snapshot_xmax(pg_current_snapshot())::text::bigint
    ) OR EXISTS (
        SELECT 1 FROM steptrail_projection_failures
        WHERE position_tx >= pg_snapshot_xmax(pg_current_snapshot())::text::bigint
    ) AS restored;

-- name: restored_tx_map
-- Every position's transaction (log, purged positions, consumers' saved positions) mapped to
-- its rank: the same order, in 1..D, so every position keeps its place relative to every
-- other and all sort before any transaction this server will run (the caller makes sure
-- the server's next id is above D first). 0 (events from before migration 0004) stays 0.
CREATE TEMPORARY TABLE steptrail_tx_map ON COMMIT DROP AS
SELECT tx AS old_tx, row_number() OVER (ORDER BY tx) AS new_tx
FROM (
    SELECT tx_id AS tx FROM steptrail_events WHERE tx_id > 0
    UNION SELECT position_tx FROM steptrail_purged_events WHERE position_tx > 0
    UNION SELECT position_tx FROM steptrail_tracking WHERE position_tx > 0
    UNION SELECT position_tx FROM steptrail_projection_failures WHERE position_tx > 0
) AS every_tx;

-- name: restored_tx_count
SELECT coalesce(max(new_tx), 0) AS top,
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_tx
FROM steptrail_tx_map;

-- name: renumber_events
UPDATE steptrail_events AS e SET tx_id = m.new_tx
FROM steptrail_tx_map AS m WHERE e.tx_id = m.old_tx AND m.old_tx <> m.new_tx;

-- name: renumber_purged_events
UPDATE steptrail_purged_events AS p SET position_tx = m.new_tx
FROM steptrail_tx_map AS m WHERE p.position_tx = m.old_tx AND m.old_tx <> m.new_tx;

-- name: renumber_tracking
UPDATE steptrail_tracking AS t SET position_tx = m.new_tx
FROM steptrail_tx_map AS m WHERE t.position_tx = m.old_tx AND m.old_tx <> m.new_tx;

-- name: renumber_projection_failures
UPDATE steptrail_projection_failures AS f SET position_tx = m.new_tx
FROM steptrail_tx_map AS m WHERE f.position_tx = m.old_tx AND m.old_tx <> m.new_tx;

-- name: advance_tx_ids
-- Use up transaction ids until the server's next one is past `until` (a restored log with
-- more transactions than this server has run). Each iteration is a committed transaction
-- that writes nothing; run on an autocommit connection with synchronous_commit off, so
-- nothing waits for the disk. A million take seconds, not minutes. `{until}` is an integer
-- literal put in by the caller (a DO block takes no parameters).
DO $$
BEGIN
    WHILE pg_snapshot_xmax(pg_current_snapshot())::text::bigint <= {until} LOOP
        PERFORM pg_current_xact_id();
        COMMIT;
    END LOOP;
END
$$;

-- name: lock_run_row
-- Signals (ADR 0073): the run's row, locked as steptrail_append locks it, after
-- lock_as_writer. A signal's delivery and a suspending append that checks the inbox take it
-- in turn, so either the wait sees the signal or the signal sees the wait.
SELECT version, status FROM steptrail_runs WHERE run_id = %(run_id)s FOR NO KEY UPDATE;

-- name: next_signal_seq
SELECT coalesce(max(seq), 0) + 1 AS seq FROM steptrail_signals WHERE run_id = %(run_id)s;

-- name: insert_signal
INSERT INTO steptrail_signals (run_id, seq, name, payload, sent_by)
VALUES (%(run_id)s, %(seq)s, %(name)s, %(payload)s, %(sent_by)s);

-- name: select_next_signal
-- The first unconsumed signal of a name: a wait consumes a run's signals of one name in
-- arrival order, and its journal entry names the one it took (ADR 0073).
SELECT seq, name, payload FROM steptrail_signals
WHERE run_id = %(run_id)s AND name = %(name)s AND seq > %(after)s
ORDER BY seq
LIMIT 1;

-- name: select_signals
SELECT seq, name, sent_by, sent_at, length(payload) AS size FROM steptrail_signals
WHERE run_id = %(run_id)s ORDER BY seq;

-- name: run_ids_like
-- Short ids (ADR 0074): the runs whose id starts with the digits (a range of the primary
-- key) or ends with them (what a table shows: a scan of the index's keys, paid only when
-- somebody typed a part of an id), then purged runs' tombstones alike. The suffix comes
-- with its dashes, matched against the uuid's canonical text.
SELECT run_id, 0 AS purged FROM (
    SELECT run_id FROM steptrail_runs WHERE run_id BETWEEN %(lo)s AND %(hi)s
    UNION
    SELECT run_id FROM steptrail_runs WHERE run_id::text LIKE %(suffix)s
) AS live
UNION ALL
SELECT run_id, 1 AS purged FROM (
    SELECT run_id FROM steptrail_tombstones WHERE run_id BETWEEN %(lo)s AND %(hi)s
    UNION
    SELECT run_id FROM steptrail_tombstones WHERE run_id::text LIKE %(suffix)s
) AS gone
ORDER BY purged, run_id
LIMIT %(limit)s;

-- name: select_schedules
-- Schedules (ADR 0076).
SELECT *, now() AS store_now FROM steptrail_schedules ORDER BY name;

-- name: select_schedule
SELECT *, now() AS store_now FROM steptrail_schedules WHERE name = %(name)s FOR UPDATE;

-- name: insert_schedule
INSERT INTO steptrail_schedules (
    name, cron, agent, request, missed, grace_ms, paused, next_tick_at, updated_by
) VALUES (
    %(name)s, %(cron)s, %(agent)s, %(request)s, %(missed)s, %(grace_ms)s, false,
    %(next_tick_at)s, %(by)s
)
ON CONFLICT (name) DO NOTHING;

-- name: update_schedule_definition
UPDATE steptrail_schedules SET
    cron = %(cron)s, agent = %(agent)s, request = %(request)s, missed = %(missed)s,
    grace_ms = %(grace_ms)s, next_tick_at = %(next_tick_at)s, updated_at = now(),
    updated_by = %(by)s
WHERE name = %(name)s;

-- name: due_schedules
SELECT *, now() AS store_now FROM steptrail_schedules
WHERE NOT paused AND next_tick_at <= now()
ORDER BY next_tick_at, name
LIMIT %(limit)s;

-- name: advance_schedule
-- A compare-and-set on the next tick: of two schedulers that fired the same ticks (one run
-- each, by their idempotency keys), one moves the schedule on and the other finds it moved.
UPDATE steptrail_schedules SET
    next_tick_at = %(next_tick_at)s,
    last_tick_at = coalesce(%(last_tick_at)s, last_tick_at),
    last_run_id = coalesce(%(last_run_id)s, last_run_id),
    updated_at = now()
WHERE name = %(name)s AND next_tick_at = %(expected)s;

-- name: pause_schedule
UPDATE steptrail_schedules SET paused = %(paused)s, updated_at = now(), updated_by = %(by)s
WHERE name = %(name)s
RETURNING *, now() AS store_now;

-- name: define_rate_limit
-- Rate limits (ADR 0080): the definition in code, stored (or changed) by a worker at its
-- start; a provider's block is kept.
INSERT INTO steptrail_rate_limits AS l (
    name, requests, tokens, per_ms, margin_ms, updated_by
) VALUES (%(name)s, %(requests)s, %(tokens)s, %(per_ms)s, %(margin_ms)s, %(by)s)
ON CONFLICT (name) DO UPDATE SET
    requests = excluded.requests, tokens = excluded.tokens, per_ms = excluded.per_ms,
    margin_ms = excluded.margin_ms, updated_at = now(), updated_by = excluded.updated_by
WHERE (l.requests, l.tokens, l.per_ms, l.margin_ms)
    IS DISTINCT FROM (excluded.requests, excluded.tokens, excluded.per_ms, excluded.margin_ms);

-- name: select_rate_limits
-- Each limit with what its window (per + margin, ending now) holds.
SELECT l.*, count(g.id) AS used_requests, coalesce(sum(g.tokens), 0) AS used_tokens
FROM steptrail_rate_limits l
LEFT JOIN steptrail_rate_grants g
    ON g.limit_name = l.name
    AND g.granted_at > clock_timestamp() - (l.per_ms + l.margin_ms) * interval '1 millisecond'
GROUP BY l.name
ORDER BY l.name;

-- name: lock_rate_limit
-- Every acquirer of a limit takes its row's lock first, so grants of one limit are decided
-- one at a time; the clock is read by the next statements, after the lock is held (see
-- window_rate_grants).
-- The acquire's commit does not wait for its WAL flush (synchronous_commit off for this
-- transaction only): a grant lost with a server crash within the WAL writer's delay lets
-- at most those grants through again once, and waiting for the flush would hold the
-- limit's lock for a disk write per grant (ADR 0080).
SELECT *, set_config('synchronous_commit', 'off', true) AS async_commit
FROM steptrail_rate_limits WHERE name = %(name)s FOR UPDATE;

-- name: acquire_rate_grant
-- One statement after the lock (SQLite runs prune_rate_grants, window_rate_use and
-- insert_rate_grant): drop the grants that left the window, total the ones in it, and
-- insert the new grant if the totals let it through — the test of domain.rate_limits.fits,
-- written here a second time so that the lock is held for one round trip. Its answer says
-- whether a grant was inserted (grant_id) and the totals it was judged on.
-- clock_timestamp(), not now(): now() is the transaction's start, which for an acquirer
-- that waited for the lock is before the grants of the holders it waited for; a grant
-- stamped with it would sit earlier in the window than it happened, and the window would
-- let one more through. Read after the lock, the clock orders grants as they were given.
-- (READ COMMITTED: this statement's snapshot, taken after the lock, sees those grants; the
-- DELETE and the totals share it, and the totals skip what the DELETE drops anyway.)
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now),
gone AS (
    DELETE FROM steptrail_rate_grants
    WHERE limit_name = %(name)s
        AND granted_at <= (SELECT now FROM clock) - %(window_us)s * interval '1 microsecond'
),
use AS MATERIALIZED (
    SELECT clock.now, count(g.id) AS grants, coalesce(sum(g.tokens), 0) AS held
    FROM clock
    LEFT JOIN steptrail_rate_grants g
        ON g.limit_name = %(name)s
        AND g.granted_at > clock.now - %(window_us)s * interval '1 microsecond'
    GROUP BY clock.now
),
granted AS (
    INSERT INTO steptrail_rate_grants (limit_name, granted_at, tokens, run_id)
    SELECT %(name)s, use.now, %(tokens)s, %(run_id)s FROM use
    WHERE (%(blocked)s::timestamptz IS NULL OR %(blocked)s::timestamptz <= use.now)
        AND (%(requests)s::bigint IS NULL OR use.grants < %(requests)s::bigint)
        AND (%(limit_tokens)s::bigint IS NULL OR use.held + %(tokens)s <= %(limit_tokens)s::bigint)
    RETURNING id
)
SELECT use.now, use.grants, use.held, (SELECT id FROM granted) AS grant_id FROM use;

-- name: window_rate_grants
-- The grants themselves, oldest first: read only when the acquirer waits (the window
-- ending at the instant acquire_rate_grant judged).
SELECT granted_at, tokens FROM steptrail_rate_grants
WHERE limit_name = %(name)s
    AND granted_at > %(now)s::timestamptz - %(window_us)s * interval '1 microsecond'
ORDER BY granted_at, id;

-- name: correct_rate_grant
-- The step reported its real tokens: they replace the estimate in every later decision.
UPDATE steptrail_rate_grants SET tokens = %(tokens)s WHERE id = %(id)s;

-- name: block_rate_limit
-- A provider's Retry-After: no grant before then, for every worker; a later block wins.
UPDATE steptrail_rate_limits
SET blocked_until = greatest(
    blocked_until, clock_timestamp() + %(ms)s * interval '1 millisecond'
)
WHERE name = %(name)s;

-- name: select_children
-- A run's child runs, oldest first (ADR 0075): the partial index on parent_id.
SELECT * FROM steptrail_runs WHERE parent_id = %(run_id)s ORDER BY created_at, run_id;

-- name: next_due
-- An idle worker's wait (ADR 0082, 0087): seconds from now() (the store's clock) to the
-- earliest available_at among the runs its agents and queues may claim (a keyed run's passed
-- due time only if its key has a free place); NULL when there is none. steptrail_next_due
-- (migrations 0037, 0038) walks the claim index and the keyed due index.
SELECT steptrail_next_due(%(agents)s::text[], %(queues)s::text[]) AS due_in_s;
