"""An async agent, run from async code through the async facade.

python -m examples.async_agents
"""

from __future__ import annotations

import asyncio

import steptrail

app = steptrail.App()
app.tool("send_email", effect="non_idempotent_write")
outbox: list[str] = []


async def search(topic: str) -> str:  # an async client call, awaited by the step
    await asyncio.sleep(0.01)
    return f"notes on {topic}"


async def ask(notes: str) -> str:
    await asyncio.sleep(0.01)
    return f"answer from {notes}"


# --8<-- [start:agent]
@app.agent("research")
async def research(ctx: steptrail.AsyncRunContext, request: dict) -> dict:
    notes = await ctx.llm("search", lambda: search(request["topic"]))  # awaited
    await ctx.tool("send_email", lambda: outbox.append(notes), arguments={"to": "ops"})
    answer = await ctx.llm("answer", lambda: ask(notes), timeout=60)  # cancelled at 60 s
    return {"answer": answer}


# --8<-- [end:agent]


async def main() -> None:
    # --8<-- [start:facade]
    async with steptrail.open_async(app) as rt:
        run_id = await rt.enqueue("research", {"topic": "durable agents"})
        await rt.work(burst=True, concurrency=100)  # or a `steptrail work` process
        print((await rt.get(run_id)).status, len(await rt.history(run_id)))
        # also: start, runs, cancel, reap, pending, approve, deny, submit_input
    # --8<-- [end:facade]


if __name__ == "__main__":
    asyncio.run(main())
