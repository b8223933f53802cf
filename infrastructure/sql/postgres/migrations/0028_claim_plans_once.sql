-- The claim is planned once per session, not once per call (ADR 0060).
--
-- steptrail_claim's statement is a chain of CTEs with a parameter in its LIMIT. PostgreSQL's
-- plan cache kept choosing a custom plan for it, so every claim planned the whole statement
-- again: a profile of a backend claiming one run at a time put 39 % of its time under
-- GetCachedPlan (the planner, and copying its trees). A generic plan is built once, but with
-- the LIMIT unknown the planner expects many picked runs and joins the claimed events to
-- steptrail_runs by hashing the table (an index scan of every row, seqscan being off): the
-- drain's server CPU doubled when that was tried. So the claim now plans generically, and
-- nested loops are its only join: the picked runs are a handful, each found by its key.
-- The function's other settings (no sort, no bitmap or sequential scan, no JIT; ADR 0037)
-- stay as they were.
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint)
    SET enable_hashjoin = off;
ALTER FUNCTION steptrail_claim(text[], integer, text, bytea, text, bigint)
    SET enable_mergejoin = off;
