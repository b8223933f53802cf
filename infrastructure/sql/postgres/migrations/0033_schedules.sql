-- Schedules (ADR 0076): each row a cron expression that enqueues a run of its agent at every
-- tick, with the next tick nobody has fired yet (by the server's clock).
CREATE TABLE IF NOT EXISTS steptrail_schedules (
    name text PRIMARY KEY,
    cron text NOT NULL,
    agent text NOT NULL,
    request text NOT NULL,
    missed text NOT NULL,
    grace_ms bigint NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    next_tick_at timestamptz NOT NULL,
    last_tick_at timestamptz,
    last_run_id uuid,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text NOT NULL
);
