-- The operator console (issue 13): keyset pagination of the runs page, newest first, with
-- (created_at, run_id) as the key and one index per filter that drives the walk (ADR 0026),
-- and ended_at for the throughput chart.
CREATE INDEX steptrail_view_run_summaries_created_idx
    ON steptrail_view_run_summaries (created_at DESC, run_id DESC);
CREATE INDEX steptrail_view_run_summaries_status_created_idx
    ON steptrail_view_run_summaries (status, created_at DESC, run_id DESC);
CREATE INDEX steptrail_view_run_summaries_agent_created_idx
    ON steptrail_view_run_summaries (agent, created_at DESC, run_id DESC);
CREATE INDEX steptrail_view_run_summaries_agent_status_created_idx
    ON steptrail_view_run_summaries (agent, status, created_at DESC, run_id DESC);
CREATE INDEX steptrail_view_run_summaries_reason_created_idx
    ON steptrail_view_run_summaries (reason, created_at DESC, run_id DESC);
CREATE INDEX steptrail_view_run_summaries_ended_idx
    ON steptrail_view_run_summaries (ended_at) WHERE ended_at IS NOT NULL;
