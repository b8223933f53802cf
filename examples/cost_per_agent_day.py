"""Tokens and cost per agent per day, as a projection of steptrail's run events.

steptrail --app examples.cost_per_agent_day:app project --every 1   # or any worker
steptrail --app examples.cost_per_agent_day:app verify cost_per_agent_day
"""

from __future__ import annotations

import steptrail
from steptrail import events

app = steptrail.App()


@app.projection("cost_per_agent_day")
class CostPerAgentDay(steptrail.Projection):
    """One row per (agent, UTC day): steps recorded, tokens and cost."""

    tables = ("cost_per_agent_day", "cost_run_agents")
    topics = (events.Queued.TOPIC, events.Started.TOPIC, events.StepRecorded.TOPIC)

    def create_tables(self, sql: steptrail.Sql) -> None:
        sql.execute(
            "CREATE TABLE IF NOT EXISTS cost_run_agents ("
            " run_id TEXT PRIMARY KEY, agent TEXT NOT NULL)"
        )
        sql.execute(
            "CREATE TABLE IF NOT EXISTS cost_per_agent_day ("
            " agent TEXT NOT NULL, day TEXT NOT NULL, steps INTEGER NOT NULL,"
            " tokens BIGINT NOT NULL, cost DOUBLE PRECISION NOT NULL,"
            " PRIMARY KEY (agent, day))"
        )

    def apply(self, event: events.RunEvent, ctx: steptrail.EventContext) -> None:
        match event:
            case events.Queued(agent=agent) | events.Started(agent=agent):
                # Steps do not name their agent: remember each run's.
                ctx.sql.execute(
                    "INSERT INTO cost_run_agents (run_id, agent) VALUES (:run_id, :agent)"
                    " ON CONFLICT (run_id) DO NOTHING",
                    {"run_id": str(ctx.run_id), "agent": agent},
                )
            case events.StepRecorded(tokens=tokens, cost=cost):
                ctx.sql.execute(
                    "INSERT INTO cost_per_agent_day (agent, day, steps, tokens, cost)"
                    " SELECT agent, :day, 1, :tokens, :cost FROM cost_run_agents"
                    " WHERE run_id = :run_id"
                    " ON CONFLICT (agent, day) DO UPDATE SET"
                    " steps = cost_per_agent_day.steps + 1,"
                    " tokens = cost_per_agent_day.tokens + excluded.tokens,"
                    " cost = cost_per_agent_day.cost + excluded.cost",
                    {
                        "run_id": str(ctx.run_id),
                        "day": ctx.recorded_at.date().isoformat(),
                        "tokens": tokens,
                        "cost": cost,
                    },
                )
