-- SQLite only (ADR 0050: SQLite keeps a step's journal entry in its event's row). On
-- PostgreSQL the journal stays a table of its own: the append is one call either way and the
-- separate table costs it about 5 % (bench/journal.py). Kept so both backends number their
-- schema versions alike.
SELECT 1;
