-- PostgreSQL only (ADR 0047: the log's read horizon per database). SQLite has one writer at
-- a time and reads the log by id; nothing to change. Kept so both backends number their
-- schema versions alike.
SELECT 1;
