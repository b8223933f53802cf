-- PostgreSQL only (ADR 0054: the claim takes the run index before the log, as the reaper
-- and every other writer do). SQLite's writers take one lock, the database's. Kept so both
-- backends number their schema versions alike.
SELECT 1;
