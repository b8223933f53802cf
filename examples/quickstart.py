"""steptrail in thirty lines: an agent with a recorded model call and a write tool.

python -m examples.quickstart     # the README's example; the tests run it as is
"""

from __future__ import annotations

import steptrail

app = steptrail.App()
app.tool("send_email", effect="non_idempotent_write")  # undeclared tools count as such too
outbox: list[str] = []


def call_model(ticket: str) -> str:  # your LLM client goes here
    return f"Re: {ticket} - we are on it"


@app.agent("triage")
def triage(ctx: steptrail.RunContext, request: dict) -> dict:
    plan = ctx.llm("plan", lambda: call_model(request["ticket"]))  # a recorded step
    ctx.tool(  # a marker is recorded under the lease first, then the write runs
        "send_email", lambda: outbox.append(plan), arguments={"to": "ops"}
    )
    return {"plan": plan}


if __name__ == "__main__":
    with steptrail.open(app) as rt:  # STEPTRAIL_DATABASE_URL or sqlite:///steptrail.db
        run_id = rt.enqueue("triage", {"ticket": "printer on fire"}, idempotency_key="t-42")
        rt.work(concurrency=8, burst=True)  # or run `steptrail --app mymod:app work`
        print(rt.get(run_id).status, [type(e.event).__name__ for e in rt.history(run_id)])
