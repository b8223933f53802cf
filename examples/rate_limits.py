"""Rate limits shared by every worker: a provider's requests and tokens per minute, a step
that estimates its tokens and reports what it used, a 429 that blocks the limit for
everyone until its Retry-After (ADR 0080), and a limit taken once per run (ADR 0083).

python -m examples.rate_limits
"""

from __future__ import annotations

import steptrail

app = steptrail.App()


def call_model(prompt: str) -> tuple[str, int]:
    """Stands in for a provider's client: the answer and the tokens it billed."""
    return prompt.upper(), len(prompt.split()) * 3


# --8<-- [start:app]
# At most 500 requests and 200,000 tokens in any 60 s, for every worker on every machine.
app.rate_limit("openai", requests=500, tokens=200_000, per=60)


@app.agent("answer")
def answer(ctx: steptrail.RunContext, request: dict) -> dict:
    def ask() -> steptrail.Recorded[str]:
        text, used = call_model(request["question"])
        return steptrail.Recorded(text, tokens=used)  # the real usage corrects the estimate

    # Before the live call (never on replay) the step takes a grant of the limit for one
    # request and 1,000 estimated tokens, waiting if the window is full.
    return {"answer": ctx.llm("ask", ask, limit="openai", tokens=1_000)}


# --8<-- [end:app]


# --8<-- [start:429]
@app.agent("careful")
def careful(ctx: steptrail.RunContext, request: dict) -> str:
    def ask() -> str:
        # What a provider's answer might say: Retry-After in seconds ("20") or as a date.
        status, headers = 429, {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}
        if status == 429:
            # Blocks "openai" for every worker until then (at most an hour); the run's
            # rate_limit retry applies.
            raise steptrail.RateLimited(retry_after=headers["Retry-After"])
        return "ok"

    return ctx.llm("ask", ask, limit="openai", tokens=500)


# --8<-- [end:429]


# --8<-- [start:run]
app.tool("search", effect="read_only")


# Each run takes one grant of "openai" (2,000 estimated tokens) before this function runs,
# once per run however often it replays (ADR 0083); its tool takes a grant of its own.
@app.agent("research", rate_limit="openai", rate_limit_tokens=2_000)
def research(ctx: steptrail.RunContext, request: dict) -> list[str]:
    def search() -> list[str]:
        return [f"{request['topic']} result"]

    return ctx.tool("search", search, arguments=request, limit="openai", tokens=10)


# --8<-- [end:run]


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        # --8<-- [start:drive]
        run_ids = [rt.enqueue("answer", {"question": f"question {n}"}) for n in range(3)]
        rt.work(burst=True)  # the worker stores the app's limits when it starts
        assert all(rt.get(r).status == "completed" for r in run_ids)
        (limit,) = rt.rate_limits()  # what `steptrail limits` lists
        assert (limit.limit.name, limit.used_requests, limit.used_tokens) == ("openai", 3, 18)
        # --8<-- [end:drive]
        researched = rt.enqueue("research", {"topic": "limits"})
        rt.work(burst=True)
        assert rt.get(researched).status == "completed"
        (limit,) = rt.rate_limits()
        assert limit.used_requests == 5  # one for the run, one for its tool
        for run_id in [*run_ids, researched]:
            print(rt.get(run_id).status)
