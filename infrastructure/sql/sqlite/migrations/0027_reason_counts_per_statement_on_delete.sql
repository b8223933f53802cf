-- PostgreSQL only (ADR 0059: deleting summaries counts their reasons down once per
-- statement). SQLite updates a row in place, so its per-row trigger costs the same for the
-- thousandth update of a count row as for the first. Kept so both backends number their
-- schema versions alike.
SELECT 1;
