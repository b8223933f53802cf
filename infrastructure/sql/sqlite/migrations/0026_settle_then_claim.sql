-- PostgreSQL only (ADR 0058: steptrail_append_claim, a settle that claims the worker's next
-- run in the same statement). SQLite runs the same two writes in one BEGIN IMMEDIATE
-- transaction from Python. Kept so both backends number their schema versions alike.
SELECT 1;
