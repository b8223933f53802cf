-- Rate limits (ADR 0080): each row a limit defined in code (stored by every worker at its
-- start) and the instant a provider's Retry-After blocks it until; each grant a step that
-- was let through, with its estimated (later: reported) tokens. Every instant is the
-- server's clock_timestamp() read while the limit's row is locked.
CREATE TABLE IF NOT EXISTS steptrail_rate_limits (
    name text PRIMARY KEY,
    requests bigint,
    tokens bigint,
    per_ms bigint NOT NULL,
    margin_ms bigint NOT NULL,
    blocked_until timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text NOT NULL
);

CREATE TABLE IF NOT EXISTS steptrail_rate_grants (
    id bigserial PRIMARY KEY,
    limit_name text NOT NULL,
    granted_at timestamptz NOT NULL,
    tokens bigint NOT NULL,
    run_id uuid NOT NULL
);

CREATE INDEX IF NOT EXISTS steptrail_rate_grants_window
    ON steptrail_rate_grants (limit_name, granted_at);
