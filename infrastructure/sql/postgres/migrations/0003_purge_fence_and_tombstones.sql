-- Every event belongs to a run in the index. After a purge removes a run, a zombie's late
-- append would otherwise find no primary-key conflict (its old events are gone) and leave an
-- orphan event; with this key it fails like any fenced append. Deferred, so a rebuild can
-- empty and refill the run index inside one transaction.
ALTER TABLE steptrail_events
    ADD CONSTRAINT steptrail_events_run_fk FOREIGN KEY (originator_id)
    REFERENCES steptrail_runs (run_id) DEFERRABLE INITIALLY DEFERRED;

-- What a purge leaves behind: that a run existed and when and why it was removed, so an
-- auditor can tell "purged" from "never existed". No content.
CREATE TABLE steptrail_tombstones (
    run_id uuid PRIMARY KEY,
    category text NOT NULL,
    purged_at timestamptz NOT NULL
);
