"""An app for the projection CLI tests: the guide's example projection, plus `broken`, which raises
on every step while `STEPTRAIL_TEST_BROKEN=1` (so a test can "fix" it by unsetting it)."""

from __future__ import annotations

import os

import steptrail
from examples.cost_per_agent_day import app as cost_app
from steptrail import events

app = steptrail.App()
app.include(cost_app)


@app.projection("broken")
class Broken(steptrail.Projection):
    tables = ("broken_steps",)

    def create_tables(self, sql: steptrail.Sql) -> None:
        sql.execute("CREATE TABLE IF NOT EXISTS broken_steps (run_id TEXT, seq INTEGER)")

    def apply(self, event: events.RunEvent, ctx: steptrail.EventContext) -> None:
        if isinstance(event, events.StepRecorded):
            if os.environ.get("STEPTRAIL_TEST_BROKEN") == "1":
                raise RuntimeError("broken on purpose")
            ctx.sql.execute(
                "INSERT INTO broken_steps (run_id, seq) VALUES (:r, :s)",
                {"r": str(ctx.run_id), "s": event.seq},
            )
