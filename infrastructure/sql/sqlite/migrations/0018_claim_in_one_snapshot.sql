-- PostgreSQL only (ADR 0048: the claim in one snapshot). SQLite has one writer at a time and
-- its claim is one statement sequence under that writer's lock; nothing to change. Kept so
-- both backends number their schema versions alike.
SELECT 1;
