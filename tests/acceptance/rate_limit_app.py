"""An app whose one agent calls a fake provider under a rate limit of 10 requests per second,
for the rate limit's process tests: `steptrail --app tests.acceptance.rate_limit_app:app work`.

The provider counts its calls outside the database: each call appends the host's clock to
the file `RATE_PROVIDER_LOG` names (one `write` of one line in append mode, which POSIX keeps
whole across processes)."""

from __future__ import annotations

import os
import time
from typing import Any

from steptrail import App, RunContext

REQUESTS, PER = 10, 1.0
app = App()
app.rate_limit("provider", requests=REQUESTS, per=PER)


def provider() -> str:
    with open(os.environ["RATE_PROVIDER_LOG"], "a", encoding="utf-8") as calls:
        calls.write(f"{time.time():.6f}\n")
    return "answer"


@app.agent("caller")
def caller(ctx: RunContext, request: dict[str, Any]) -> str:
    return ctx.llm("ask", provider, limit="provider", tokens=1)
