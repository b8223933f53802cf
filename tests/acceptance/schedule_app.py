"""An app with one schedule ticking every second, for the scheduler's process tests:
`steptrail --app tests.acceptance.schedule_app:app work`."""

from __future__ import annotations

from typing import Any

from steptrail import App, RunContext

app = App()


@app.agent("heartbeat")
def heartbeat(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    return {"source": request.get("source")}


app.schedule("* * * * * *", "heartbeat", request={"source": "cron"}, name="every-second")
