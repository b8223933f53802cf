-- PostgreSQL only (ADR 0063: a step's update of its run's row is a HOT update there). SQLite
-- has no heap-only updates: an UPDATE rewrites the entries of every index over a column it
-- sets, whatever the new value, so a generated column would not spare the lease index a
-- step's write. Kept so both backends number their schema versions alike.
SELECT 1;
