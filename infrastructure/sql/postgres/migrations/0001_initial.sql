-- The event log, laid out as the eventsourcing library's PostgresApplicationRecorder lays out
-- its table (so its notification reader and subscription work on it), plus `recorded_at`: the
-- store's clock at commit, which is the only clock steptrail judges time by (ADR 0003).
CREATE TABLE steptrail_events (
    originator_id uuid NOT NULL,
    originator_version bigint NOT NULL,
    topic text NOT NULL,
    state bytea NOT NULL,
    notification_id bigserial NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (originator_id, originator_version)
);
CREATE UNIQUE INDEX steptrail_events_notification_id_idx
    ON steptrail_events (notification_id ASC);

-- The run index: one row per run, its folded state (hot fields as columns, the rest in `doc`)
-- and the store's instants. Maintained in the same transaction as the events (ADR 0004).
CREATE TABLE steptrail_runs (
    run_id uuid PRIMARY KEY,
    agent text NOT NULL,
    status text NOT NULL,
    version bigint NOT NULL,
    segment text,
    holder text,
    lease_ms bigint,
    claim_version bigint,
    requeue_count integer NOT NULL DEFAULT 0,
    reason text,
    idempotency_key text,
    doc jsonb NOT NULL,
    lease_expires_at timestamptz,
    available_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
-- Claiming looks up the queued run that became available first: O(log n) in all runs.
CREATE INDEX steptrail_runs_claimable_idx
    ON steptrail_runs (available_at, run_id) WHERE status = 'queued';
-- The reaper scans only running runs ordered by deadline, so its cost follows stale runs.
CREATE INDEX steptrail_runs_lease_idx
    ON steptrail_runs (lease_expires_at) WHERE status = 'running';
CREATE UNIQUE INDEX steptrail_runs_idempotency_key_idx
    ON steptrail_runs (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX steptrail_runs_status_idx ON steptrail_runs (status, agent, created_at);
CREATE INDEX steptrail_runs_created_idx ON steptrail_runs (created_at);

-- What a run needs to run again but must not keep forever: the queued request and the
-- resumable state of a waiting run, verbatim. Deleted in the transaction that settles the run,
-- which is how "clearing" works beside an append-only log (ADR 0008).
CREATE TABLE steptrail_saved (
    run_id uuid NOT NULL,
    kind text NOT NULL,
    body bytea NOT NULL,
    PRIMARY KEY (run_id, kind)
);
