-- Reporting views, maintained from the notification log by a tracked runner: a batch's view
-- changes and the runner's position commit in one transaction (exactly once).
CREATE TABLE steptrail_tracking (
    projection text PRIMARY KEY,
    position bigint NOT NULL
);

CREATE TABLE steptrail_view_run_summaries (
    run_id uuid PRIMARY KEY,
    agent text NOT NULL,
    status text NOT NULL,
    reason text,
    state jsonb NOT NULL,
    steps integer NOT NULL,
    step_ms bigint NOT NULL,
    suspensions integer NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    ended_at timestamptz
);
CREATE INDEX steptrail_view_run_summaries_status_idx
    ON steptrail_view_run_summaries (status, reason);

CREATE TABLE steptrail_view_status_counts (
    agent text NOT NULL,
    status text NOT NULL,
    count bigint NOT NULL,
    PRIMARY KEY (agent, status)
);

CREATE TABLE steptrail_view_dead_letters (
    run_id uuid PRIMARY KEY,
    agent text NOT NULL,
    reason text NOT NULL,
    cause text NOT NULL,
    failure_class text,
    error_type text,
    requeue_count integer NOT NULL,
    dead_lettered_at timestamptz NOT NULL
);
CREATE INDEX steptrail_view_dead_letters_when_idx
    ON steptrail_view_dead_letters (dead_lettered_at DESC);
