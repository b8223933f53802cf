"""A digest agent that runs every morning, fired by the workers' scheduler (ADR 0076).

python -m examples.schedules
"""

from __future__ import annotations

import threading

import steptrail

app = steptrail.App()


# --8<-- [start:schedule]
@app.agent("digest")
def digest(ctx: steptrail.RunContext, request: dict) -> dict:
    news = ctx.llm("summarise", lambda: f"what happened for {request['team']}")
    return {"team": request["team"], "digest": news}


# Every day at 07:00 UTC; a tick missed while no worker ran is skipped ("latest" would run
# the newest missed one once). `steptrail --app examples.schedules:app work` fires it.
app.schedule("0 7 * * *", "digest", request={"team": "ops"}, name="morning-digest")
# --8<-- [end:schedule]


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        # --8<-- [start:drive]
        scheduler = rt.scheduler()
        scheduler.reconcile()  # what `steptrail work` does when it starts
        print([(s.name, s.schedule.cron, s.next_tick_at.isoformat()) for s in rt.schedules()])
        run_id = rt.trigger_schedule("morning-digest", by="alice")  # one run now, off-tick
        rt.work(burst=True)
        print(rt.get(run_id).status)  # completed
        # In a long-lived process of your own, instead of `steptrail work`:
        stop = threading.Event()
        thread = threading.Thread(target=scheduler.run_forever, args=(1.0, stop))
        thread.start()
        stop.set()
        thread.join()
        # --8<-- [end:drive]
