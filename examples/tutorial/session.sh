#!/usr/bin/env bash
# The tutorial's shell session, run as is by tests/acceptance/test_tutorial.py; the tutorial
# (docs/tutorial.md) shows it section by section. Run it from a clone of steptrail, with the
# virtual environment active: bash examples/tutorial/session.sh
set -euo pipefail
# --8<-- [start:configure]
export STEPTRAIL_APP=examples.tutorial.support:app   # your agents, for every command
export STEPTRAIL_DATABASE_URL=sqlite:///tutorial.db  # a fresh SQLite file, no server
export STEPTRAIL_LEASE_SECONDS=5                     # short leases, to see the reaper work
steptrail migrate
# --8<-- [end:configure]

# --8<-- [start:enqueue]
RUN_ID=$(steptrail enqueue support \
  --request '{"customer": "ada@example.com", "question": "Where is my order?"}')
echo "queued $RUN_ID"
# --8<-- [end:enqueue]

# --8<-- [start:crash]
steptrail work &          # a worker claims the run and starts "research" (3 s)
WORKER=$!
sleep 4.5                 # research is done and recorded; "draft" is under way
kill -9 "$WORKER"         # the machine dies: no goodbye, the lease is still held
wait "$WORKER" || true
steptrail show "$RUN_ID"  # still running, held by a worker that is gone
# --8<-- [end:crash]

# --8<-- [start:reap]
sleep 6                   # past the 5 s lease, by the database's clock
steptrail reap            # Reaped 1 stale run(s): 1 requeued, 0 dead-lettered, 0 skipped
steptrail work --burst    # a new worker: research is replayed, draft runs, then it waits
steptrail show "$RUN_ID"  # ... Reclaimed, Claimed, Replayed, StepRecorded, Suspended
# --8<-- [end:reap]

# --8<-- [start:approve]
steptrail runs --status waiting_for_approval  # the inbox: the pending call and its digest
steptrail approve "$RUN_ID" --by you          # bound to the digest of that exact call
steptrail work --burst                        # replays to the approval, sends, completes
# --8<-- [end:approve]

# --8<-- [start:trail]
steptrail show "$RUN_ID"   # the whole trail: who did what, in order, at which version
cat model-calls.log        # research and draft once each: replayed, never paid twice
cat outbox.txt             # one reply, sent once
# --8<-- [end:trail]
