-- PostgreSQL only (ADR 0082: steptrail_next_due, the idle worker's wait as a function with
-- its own planner settings). SQLite walks the claim index from Python (sqlite_wake.py) with
-- the named query next_due_at. Kept so both backends number their schema versions alike.
SELECT 1;
