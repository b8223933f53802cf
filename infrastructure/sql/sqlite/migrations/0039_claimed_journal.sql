-- PostgreSQL only (ADR 0086: steptrail_claimed_journal, the claim returning each claimed
-- run's journal with a snapshot taken after its locks). A SQLite segment reads its journal
-- itself, in-process. Kept so both backends number their schema versions alike.
SELECT 1;
