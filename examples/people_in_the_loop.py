"""A person approves a drafted e-mail before it is sent, by hand with `ctx.resumed`.

python -m examples.people_in_the_loop
"""

from __future__ import annotations

import steptrail

app = steptrail.App()
app.tool("send_email", effect="non_idempotent_write")
sent: list[str] = []


def write_email(request: dict) -> str:  # your model call
    return f"Dear {request['to']}, your order has shipped."


def send_email(body: str) -> str:
    sent.append(body)
    return "sent"


# --8<-- [start:agent]
@app.agent("mailer")
def mailer(ctx: steptrail.RunContext, request: dict) -> dict:
    if ctx.resumed is None:  # first segment
        draft = ctx.llm("draft", lambda: write_email(request))
        ctx.request_approval(
            [{"name": "send_email", "arguments": {"body": draft}}],
            conversation=[{"role": "assistant", "content": draft}],
        )
    # resumed after `steptrail approve` (calls run) or `deny` (each gets "denied by the operator")
    results = ctx.run_pending({"send_email": send_email})
    return {"sent": [r.error is None for r in results]}


# --8<-- [end:agent]


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        # --8<-- [start:decide]
        run_id = rt.enqueue("mailer", {"to": "Ada"})
        rt.work(burst=True)  # suspends: waiting_for_approval, no lease held
        pending = rt.pending(run_id)  # the calls and the SHA-256 digest a decision quotes
        rt.approve(run_id, by="alice", digest=pending.digest)  # or rt.deny(...)
        rt.work(burst=True)  # a worker resumes it from the queue
        # --8<-- [end:decide]
        assert sent == ["Dear Ada, your order has shipped."]
        print(rt.get(run_id).status)
