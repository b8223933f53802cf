-- Concurrency limits per key (ADR 0078, issue 28): a run may carry a concurrency key and
-- the limit resolved for it at enqueue (columns of the run index; NULL for a run without a
-- key, as every existing run). The claim index serves runs without a key only; keyed runs
-- have their own index by key. steptrail_concurrency_keys holds each key's limit, its runs
-- running and pending (claimable now or later) and when it was last served (a counter),
-- kept by triggers in the transaction of every write to the run index; the claim walks it
-- least recently served first (`infrastructure/sqlite_keys.py`).
ALTER TABLE steptrail_runs ADD COLUMN concurrency_key TEXT;
ALTER TABLE steptrail_runs ADD COLUMN concurrency_limit INTEGER;

DROP INDEX IF EXISTS steptrail_runs_claim_idx;
CREATE INDEX steptrail_runs_claim_idx
    ON steptrail_runs (agent, queue, priority DESC, available_at, run_id)
    WHERE available_at IS NOT NULL AND concurrency_limit IS NULL;
CREATE INDEX IF NOT EXISTS steptrail_runs_keyed_idx
    ON steptrail_runs (concurrency_key, priority DESC, available_at, run_id)
    WHERE available_at IS NOT NULL AND concurrency_limit IS NOT NULL;
CREATE INDEX IF NOT EXISTS steptrail_runs_key_status_idx
    ON steptrail_runs (concurrency_key, status) WHERE concurrency_key IS NOT NULL;

CREATE TABLE IF NOT EXISTS steptrail_concurrency_keys (
    key TEXT PRIMARY KEY,
    concurrency_limit INTEGER NOT NULL,
    running INTEGER NOT NULL DEFAULT 0,
    pending INTEGER NOT NULL DEFAULT 0,
    last_served INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS steptrail_concurrency_keys_ready_idx
    ON steptrail_concurrency_keys (last_served, key)
    WHERE pending > 0 AND running < concurrency_limit;
-- The next serve number is the largest one plus one: one descent of this index.
CREATE INDEX IF NOT EXISTS steptrail_concurrency_keys_served_idx
    ON steptrail_concurrency_keys (last_served);

-- One statement per trigger, as the reason counts' (0016). An update that changes none of
-- status, claimability or key (a step, a renewal) fires none of them. Served: one of the
-- key's runs was just claimed (the serve counter moves on).
CREATE TRIGGER IF NOT EXISTS steptrail_concurrency_insert
AFTER INSERT ON steptrail_runs WHEN new.concurrency_key IS NOT NULL
BEGIN
    INSERT INTO steptrail_concurrency_keys (key, concurrency_limit, running, pending)
    VALUES (
        new.concurrency_key, new.concurrency_limit, new.status = 'running',
        new.available_at IS NOT NULL
    )
    ON CONFLICT (key) DO UPDATE SET
        concurrency_limit = excluded.concurrency_limit,
        running = running + excluded.running,
        pending = pending + excluded.pending; END;

CREATE TRIGGER IF NOT EXISTS steptrail_concurrency_delete
AFTER DELETE ON steptrail_runs WHEN old.concurrency_key IS NOT NULL
BEGIN
    UPDATE steptrail_concurrency_keys SET
        running = running - (old.status = 'running'),
        pending = pending - (old.available_at IS NOT NULL)
    WHERE key = old.concurrency_key; END;

CREATE TRIGGER IF NOT EXISTS steptrail_concurrency_update_old
AFTER UPDATE OF status, available_at, concurrency_key ON steptrail_runs
WHEN old.concurrency_key IS NOT NULL AND (
    old.status IS NOT new.status
    OR (old.available_at IS NULL) <> (new.available_at IS NULL)
    OR old.concurrency_key IS NOT new.concurrency_key
)
BEGIN
    UPDATE steptrail_concurrency_keys SET
        running = running - (old.status = 'running'),
        pending = pending - (old.available_at IS NOT NULL)
    WHERE key = old.concurrency_key; END;

CREATE TRIGGER IF NOT EXISTS steptrail_concurrency_update_new
AFTER UPDATE OF status, available_at, concurrency_key ON steptrail_runs
WHEN new.concurrency_key IS NOT NULL AND (
    old.status IS NOT new.status
    OR (old.available_at IS NULL) <> (new.available_at IS NULL)
    OR old.concurrency_key IS NOT new.concurrency_key
)
BEGIN
    INSERT INTO steptrail_concurrency_keys (key, concurrency_limit, running, pending)
    VALUES (
        new.concurrency_key, new.concurrency_limit, new.status = 'running',
        new.available_at IS NOT NULL
    )
    ON CONFLICT (key) DO UPDATE SET
        running = running + excluded.running,
        pending = pending + excluded.pending,
        last_served = CASE WHEN excluded.running = 1 AND old.status IS NOT 'running'
            THEN (SELECT coalesce(max(last_served), 0) + 1 FROM steptrail_concurrency_keys)
            ELSE last_served END; END;
