-- PostgreSQL only (ADR 0060: the claim function is planned once per session). SQLite's
-- claim statements are prepared once per connection by its statement cache. Kept so both
-- backends number their schema versions alike.
SELECT 1;
