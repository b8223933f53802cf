"""Concurrency limits per key: a tenant's backlog never starves another tenant, and one
mailbox is written by one run at a time (ADR 0078).

python -m examples.concurrency_keys
"""

from __future__ import annotations

import steptrail

app = steptrail.App()


# --8<-- [start:app]
app.limit("tenant:*", 2)  # at most 2 runs of any one tenant at once, across every worker
app.limit("tenant:enterprise-*", 5)  # more specific: wins for the tenants it matches


@app.agent("report")
def report(ctx: steptrail.RunContext, request: dict) -> dict:
    return {"rows": ctx.step("tool", "query", lambda: len(request["tenant"]))}


@app.agent("send_mail", concurrency_key="mailbox:ops", concurrency_limit=1)
def send_mail(ctx: steptrail.RunContext, request: dict) -> dict:
    return {"sent": ctx.step("tool", "send", lambda: request["to"])}


# --8<-- [end:app]


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        # --8<-- [start:drive]
        big = rt.enqueue_many(
            [
                {"agent": "report", "request": {"tenant": "acme"}, "concurrency_key": "tenant:acme"}
                for _ in range(50)
            ]
        )
        small = rt.enqueue("report", {"tenant": "zed"}, concurrency_key="tenant:zed")
        mail = rt.enqueue("send_mail", {"to": "ops@example.com"})  # key mailbox:ops, limit 1
        assert rt.get(small).state.concurrency_limit == 2

        order: list = []
        rt.worker(concurrency=4, burst=True, on_result=lambda r: order.append(r.run_id)).run()
        # Round-robin between keys: zed's one run is not behind acme's fifty.
        assert order.index(small) < 10
        # --8<-- [end:drive]
        for run_id in (small, mail, big[-1]):
            print(rt.get(run_id).status)
