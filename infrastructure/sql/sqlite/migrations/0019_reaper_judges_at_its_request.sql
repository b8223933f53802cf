-- PostgreSQL only (ADR 0049: the reaper judges a lease by the instant it asked to look).
-- SQLite's reaper reads the store's clock in Python before it waits for the write lock;
-- nothing to change in the schema. Kept so both backends number their schema versions alike.
SELECT 1;
