-- ADR 0050: on SQLite a step's journal entry rides in its event's row, the page the append
-- writes anyway, instead of a table of its own (one more B-tree page in every step's
-- commit). The column holds the whole entry as one JSON array
-- [seq, position, kind, name, fingerprint, outcome]; it is set NULL when the run settles,
-- and goes with the row when the run is purged. The log's own columns are unchanged.
ALTER TABLE steptrail_events ADD COLUMN journal BLOB;

-- Entries of runs in flight move to their runs' event rows: the k-th entry (by seq) into
-- the k-th event (by version). Which row holds an entry does not matter (the entry says
-- which step it answers), only that each row holds at most one, and a run has at least as
-- many events as entries (each entry was written with its own StepRecorded).
UPDATE steptrail_events SET journal = moved.body
FROM (
    SELECT e.notification_id, j.body
    FROM (
        SELECT run_id,
               json_array(seq, position, kind, name, fingerprint, json(CAST(outcome AS TEXT)))
                   AS body,
               row_number() OVER (PARTITION BY run_id ORDER BY seq) AS k
        FROM steptrail_journal
    ) AS j
    JOIN (
        SELECT notification_id, originator_id,
               row_number() OVER (PARTITION BY originator_id ORDER BY originator_version) AS k
        FROM steptrail_events
        WHERE originator_id IN (SELECT run_id FROM steptrail_journal)
    ) AS e ON e.originator_id = j.run_id AND e.k = j.k
) AS moved
WHERE steptrail_events.notification_id = moved.notification_id;

DROP TABLE steptrail_journal;
