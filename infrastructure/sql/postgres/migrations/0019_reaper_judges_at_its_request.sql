-- The reaper judges a lease by the instant it asked to look, not the instant it was let in
-- (ADR 0049, refining ADR 0016).
--
-- The reaper's scan waits for writers in flight (lock_for_reaper: SHARE on the run index and
-- the log) and used to compare leases with its own start, statement_timestamp(), which comes
-- after that wait. A worker's renewal that queued behind the same lock AFTER the reaper (the
-- lock is held for longer than a lease: a LOCK TABLE, a long rebuild range) was then judged
-- by a clock that had moved on while it waited behind the reaper: its run looked stale, and
-- whether it was reclaimed came down to which of the woken renewal and the reaper's reclaim
-- reached the row first. Judged at the transaction's start (now(): the reaper's BEGIN, just
-- before it asks for the lock), a lease is stale only if it ran out before the reaper asked;
-- a live holder sends its renewal half a lease before its lease runs out (ADR 0007, 0016), so
-- that renewal is already ahead of the reaper in the lock queue and lands before the scan.
-- now() is stable, so the lease index still answers the comparison (ADR 0037).
CREATE OR REPLACE FUNCTION steptrail_stale(p_limit integer)
RETURNS SETOF steptrail_runs
LANGUAGE plpgsql STABLE ROWS 100
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM steptrail_runs
    WHERE status = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT p_limit;
END
$$;
