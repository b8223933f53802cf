"""Durable steps: replay on recovery, a write made idempotent by its key, decisions that
return in the flow, and deadlines.

    python -m examples.durable_steps
"""

from __future__ import annotations

import steptrail

app = steptrail.App()
calls: list[str] = []


class Crm:
    """Stands in for a CRM whose upsert takes an idempotency key."""

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}

    def upsert(self, lead: str, *, key: str) -> str:
        self.rows[key] = lead
        return "ok"


crm = Crm()


def write_email(request: dict) -> str:
    calls.append("draft")
    return f"Hello {request['lead']}"


def send_email(body: str) -> str:
    calls.append("send")
    return "sent"


def summarise(values: dict) -> str:
    return f"note: {values.get('note', '')}"


# --8<-- [start:agent]
app.tool("send_email", effect="non_idempotent_write")  # never run again once recorded
app.tool("upsert_crm", effect="idempotent_write", timeout=10)  # may re-run: give it the key


@app.agent("outreach", step_timeout=60, max_duration=900)
def outreach(ctx: steptrail.RunContext, request: dict) -> dict:
    draft = ctx.llm("draft", lambda: write_email(request), args=request)  # replayed on retry
    ctx.tool(
        "upsert_crm",
        lambda: crm.upsert(request["lead"], key=ctx.idempotency_key),
        arguments={"lead": request["lead"]},
    )
    decision = ctx.request_approval([{"name": "send_email", "arguments": {"body": draft}}])
    # First segment: suspends here. After `steptrail approve`: "draft" and "upsert_crm" are
    # replayed from the journal (not called again) and this returns the decision.
    results = ctx.run_pending({"send_email": send_email})
    values = ctx.request_input({"type": "object", "properties": {"note": {"type": "string"}}})
    ctx.llm("summary", lambda: summarise(values), timeout=30)
    return {"approved": decision.approved, "sent": [r.error is None for r in results]}


# --8<-- [end:agent]


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        run_id = rt.enqueue("outreach", {"lead": "Grace"})
        rt.work(burst=True)  # waits for approval
        rt.approve(run_id, by="alice")
        rt.work(burst=True)  # replays draft and upsert, sends, waits for input
        rt.submit_input(run_id, {"note": "call back Monday"}, by="alice")
        rt.work(burst=True)
        assert calls == ["draft", "send"], calls  # the model was not called again
        print(rt.get(run_id).status)
