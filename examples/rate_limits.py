"""Rate limits shared by every worker: a provider's requests and tokens per minute, a step
that estimates its tokens and reports what it used, and a 429 that blocks the limit for
everyone until its Retry-After (ADR 0080).

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
        status, retry_after = 429, 20.0  # what a provider's answer might say
        if status == 429:
            # Blocks "openai" for every worker for 20 s; the run's rate_limit retry applies.
            raise steptrail.RateLimited(retry_after=retry_after)
        return "ok"

    return ctx.llm("ask", ask, limit="openai", tokens=500)


# --8<-- [end:429]


if __name__ == "__main__":
    with steptrail.open(app) as rt:
        # --8<-- [start:drive]
        run_ids = [rt.enqueue("answer", {"question": f"question {n}"}) for n in range(3)]
        rt.work(burst=True)  # the worker stores the app's limits when it starts
        assert all(rt.get(r).status == "completed" for r in run_ids)
        (limit,) = rt.rate_limits()  # what `steptrail limits` lists
        assert (limit.limit.name, limit.used_requests, limit.used_tokens) == ("openai", 3, 18)
        # --8<-- [end:drive]
        for run_id in run_ids:
            print(rt.get(run_id).status)
