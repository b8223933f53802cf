"""An app whose runs are limited per tenant, for the concurrency-key process tests
(ADR 0078): `steptrail --app tests.acceptance.keys_app:app work`."""

from __future__ import annotations

import time
from typing import Any

from steptrail import App, RunContext

app = App()
app.limit("tenant:*", 2)


@app.agent("tenant_task")
def tenant_task(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.01)  # long enough for the sampler to see runs hold their places
    return {"n": request.get("n")}
