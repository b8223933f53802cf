-- Readers of the log see every transaction that can no longer add to it, in this database
-- only (ADR 0047). Until now the horizon was pg_snapshot_xmin: the oldest transaction still
-- running anywhere in the cluster, so an idle-in-transaction session of another
-- application, or a long report in another database, held every view, projection and feed
-- consumer of every steptrail database on the server back until it ended.
--
-- A transaction can add events only if it holds a lock on the log or the run index, and
-- every steptrail writer takes that lock (at the start of its first statement) before it is
-- given a transaction id (at its first row change). So a transaction in progress in the
-- statement's snapshot with an id below the horizon either holds such a lock (it is the
-- horizon) or never will; one that ended after the snapshot was taken is not visible in it
-- and is kept as the horizon too (the next read passes it). Transactions that start later
-- get ids at or above the snapshot's xmax. The function is STABLE: it sees the caller's
-- statement snapshot, and pg_locks is read after that snapshot was taken, which is the order
-- the argument needs. Callers evaluate it once per statement (a MATERIALIZED CTE).
CREATE OR REPLACE FUNCTION steptrail_log_horizon() RETURNS bigint
LANGUAGE sql STABLE AS $$
    WITH snap AS MATERIALIZED (
        SELECT pg_current_snapshot() AS s
    ), locks AS MATERIALIZED (
        SELECT locktype, virtualtransaction, transactionid, database, relation FROM pg_locks
    ), writers AS (
        SELECT t.transactionid::text::bigint AS xid32
        FROM locks AS t
        JOIN locks AS r ON r.virtualtransaction = t.virtualtransaction
        WHERE t.locktype = 'transactionid'
          AND r.locktype = 'relation'
          AND r.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND r.relation IN ('steptrail_events'::regclass, 'steptrail_runs'::regclass)
    ), alive AS (
        SELECT transactionid::text::bigint AS xid32 FROM locks WHERE locktype = 'transactionid'
    )
    SELECT least(
        pg_snapshot_xmax(snap.s)::text::bigint,
        (SELECT min(x::text::bigint)
         FROM pg_snapshot_xip(snap.s) AS x
         WHERE x::text::bigint % 4294967296 IN (SELECT xid32 FROM writers)
            OR x::text::bigint % 4294967296 NOT IN (SELECT xid32 FROM alive))
    )
    FROM snap
$$;
