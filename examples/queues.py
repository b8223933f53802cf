"""Named queues and priorities: a heavy queue with its own workers, an urgent run that jumps
the line, and a priority changed while a run waits (ADR 0077).

python -m examples.queues
"""

from __future__ import annotations

import steptrail

app = steptrail.App()


# --8<-- [start:app]
@app.agent("summarise")  # the default queue, priority 0
def summarise(ctx: steptrail.RunContext, request: dict) -> dict:
    return {"summary": ctx.step("llm", "summarise", lambda: request["text"][:20])}


@app.agent("transcribe", queue="heavy", priority=5)  # its runs go to "heavy" by default
def transcribe(ctx: steptrail.RunContext, request: dict) -> dict:
    return {"words": ctx.step("tool", "transcribe", lambda: len(request["audio"]))}


app.queue("bulk")  # a queue no agent defaults to, for backfills


# --8<-- [end:app]


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        # --8<-- [start:drive]
        rt.enqueue_many(
            [{"agent": "summarise", "request": {"text": f"doc {n}"}} for n in range(100)]
        )
        urgent = rt.enqueue("summarise", {"text": "the outage report"}, priority=9)
        backfill = rt.enqueue("summarise", {"text": "a backfill"}, queue="bulk", priority=-5)
        heavy = rt.enqueue("transcribe", {"audio": "..."})  # queue heavy, priority 5

        rt.work(burst=True, queues=["heavy"])  # a worker of the heavy queue only
        assert rt.get(heavy).status == "completed"
        assert rt.get(urgent).status == "queued"  # not its queue

        rt.set_priority(backfill, 10, by="ops")  # the backfill is wanted first after all
        order: list = []
        rt.worker(burst=True, on_result=lambda r: order.append(r.run_id)).run()  # every queue
        assert order[:2] == [backfill, urgent]  # priority 10, then 9, then the backlog
        # --8<-- [end:drive]
        for run_id in (heavy, backfill, urgent):
            print(rt.get(run_id).status)
