-- A purged run costs the pages it touches (ADR 0052). The summaries' (status, reason) index
-- orders the entries of one status and reason by run id, which is random: every summary the
-- projector writes or a purge deletes lands on its own leaf page of it. No read uses it any
-- more: `stats` reads the reason counts (migration 0016), `runs` walks the
-- (status | agent | reason, created_at) indexes (migration 0009), and `verify`'s recount of
-- the reasons (count_reasons) reads the whole table either way.
DROP INDEX IF EXISTS steptrail_view_run_summaries_status_idx;
