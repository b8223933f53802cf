"""A booking sleeps, then waits for a payment webhook with a deadline (ADR 0073).

python -m examples.waits
"""

from __future__ import annotations

import time

import steptrail

app = steptrail.App()


# --8<-- [start:agent]
@app.agent("booking")
def booking(ctx: steptrail.RunContext, request: dict) -> dict:
    hold = ctx.step("tool", "hold_seat", lambda: f"seat {request['seat']} held")
    ctx.sleep(0.2)  # no lease, no worker slot while it sleeps; the store's clock wakes it
    try:
        payment = ctx.wait_event("payment", timeout=3600)  # an outside event, or an hour
    except steptrail.WaitTimedOut:
        return {"hold": hold, "paid": False}
    return {"hold": hold, "paid": True, "amount": payment["amount"]}


# --8<-- [end:agent]


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        # --8<-- [start:drive]
        run_id = rt.enqueue("booking", {"seat": "12A"})
        rt.work(burst=True)  # holds the seat, then sleeps: waiting_for_timer
        time.sleep(0.3)
        rt.work(burst=True)  # claimed at its wake-up: now waiting_for_event
        rt.signal(run_id, "payment", {"amount": 120})  # the webhook; queues the run at once
        rt.work(burst=True)  # resumes with the payment's payload
        # --8<-- [end:drive]
        run = rt.get(run_id)
        print(run.status)
