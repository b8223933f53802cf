-- A step's update of its run's row is a HOT update (ADR 0063).
--
-- PostgreSQL updates a row in place of its page, with no new entry in any index, only when no
-- indexed column changes. Every step moved two: lease_expires_at (the reaper's lease index)
-- and updated_at (the queued-since index of `stats`), so each step inserted a new entry
-- into each of the table's six indexes whose predicate the row meets, and left as many dead
-- ones for VACUUM. Both indexes now read a generated column that a step leaves unchanged:
--
-- * lease_due_at: the lease's expiry rounded down to a multiple of half the lease, for
--   running runs. A run that steps more often than every half lease moves it once per half
--   lease; a stale lease (lease_expires_at < now) has lease_due_at <= lease_expires_at, so
--   the reaper's walk of `lease_due_at <= now()` finds every one of them, and passes over
--   only live leases that expire within half a lease, which a live holder's renewal (every
--   third of a lease without a step, ADR 0007) keeps from happening.
-- * queued_at: updated_at while the run is queued (NULL otherwise): the queued-since index
--   answers the same question, and a running run's steps leave it NULL.
--
-- A lease of more than a day is bucketed by half a day (an interval cannot hold any bigint of
-- milliseconds, and a generated column that fails fails the write); a row with no lease
-- length, which no writer makes, is bucketed by its expiry itself.
--
-- Generated columns need no writer to remember them (the append, the claim, a rebuild's
-- upsert, the bulk loader), which is why they are not plain columns set by those writers.
-- Adding a stored generated column rewrites the table once, under an exclusive lock.
ALTER TABLE steptrail_runs
    ADD COLUMN lease_due_at timestamptz GENERATED ALWAYS AS (
        CASE WHEN status = 'running' THEN
            CASE WHEN lease_ms > 0 THEN date_bin(
                LEAST(lease_ms, 86400000) * interval '500 microseconds', lease_expires_at,
                TIMESTAMPTZ '2000-01-01 00:00:00+00'
            ) ELSE lease_expires_at END
        END
    ) STORED,
    ADD COLUMN queued_at timestamptz GENERATED ALWAYS AS (
        CASE WHEN status = 'queued' THEN updated_at END
    ) STORED;

CREATE INDEX steptrail_runs_lease_due_idx ON steptrail_runs (lease_due_at)
    WHERE status = 'running';
CREATE INDEX steptrail_runs_queued_at_idx ON steptrail_runs (queued_at)
    WHERE status = 'queued';
DROP INDEX steptrail_runs_lease_idx;
DROP INDEX steptrail_runs_queued_since_idx;

-- The reaper judges a lease by lease_expires_at at its request (ADR 0049), as before; the
-- walk is along lease_due_at, and within one half-lease bucket in no particular order.
CREATE OR REPLACE FUNCTION steptrail_stale(p_limit integer)
RETURNS SETOF steptrail_runs
LANGUAGE plpgsql STABLE ROWS 100
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM steptrail_runs
    WHERE status = 'running' AND lease_due_at <= now() AND lease_expires_at < now()
    ORDER BY lease_due_at
    LIMIT p_limit;
END
$$;

CREATE OR REPLACE FUNCTION steptrail_stale_count()
RETURNS bigint
LANGUAGE plpgsql STABLE
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM (
        SELECT 1 FROM steptrail_runs
        WHERE status = 'running' AND lease_due_at <= now() AND lease_expires_at < now()
        ORDER BY lease_due_at
    ) AS stale;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION steptrail_oldest_queued() RETURNS timestamptz
LANGUAGE sql STABLE
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $$
    SELECT queued_at FROM steptrail_runs WHERE status = 'queued'
    ORDER BY queued_at LIMIT 1
$$;
