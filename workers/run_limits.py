"""An agent's run-level rate limit (ADR 0083): one grant per run, taken before the agent runs.

`@app.agent(..., rate_limit="openai", rate_limit_tokens=n)` makes each run of the agent
take one grant of that limit when its first segment starts, before any of the agent's code
runs; without a grant the run waits exactly as a limited step does (in place up to
`rate_limits.PATIENCE_S`, else asleep on the timer `rate_limit:NAME`, no lease, no slot).
The rules that make it safe:

* **It is a step, so replay never takes it twice.** The grant is taken by a step of kind
  `rate_limit` named after the limit at the journal's first position (`ctx.step(...,
  limit=...)` with a callable that does nothing): every later segment of the run (after a
  sleep, a decision, a retry or a reclaim) replays it from the journal and asks for
  nothing. The limit counts runs started, not segments or attempts.
* **Only a run that has not started takes it.** A journal whose first entry is another step
  belongs to a run that started before its agent had the option (a deploy that added it):
  it takes none, rather than diverge from its journal. A journal whose first entry is a
  `rate_limit` step is replayed by that entry's own name, whatever the agent names now, so
  removing or renaming the option never breaks a run in flight.
* **Until its step is appended, it may be taken again.** The step's record rides with the
  run's next append, as any step's does: a segment lost between the grant and that append
  (a crash before the agent's first step) takes another grant when the run is reclaimed.
  That spends the window, never overshoots it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from steptrail.workers.async_context import AsyncRunContext
    from steptrail.workers.context import RunContext
    from steptrail.workers.registry import AgentSpec

# The kind of the step that takes a run's grant; its name is the limit's.
GATE_KIND = "rate_limit"


def _nothing() -> None:
    return None


def _gate(ctx: RunContext, spec: AgentSpec) -> tuple[str, str | None, int | None] | None:
    """The gate step's (name, limit, tokens): the limit and its estimate to take, or both
    None to replay the journal's gate; None: no gate."""
    upcoming = ctx._journal.upcoming()
    if upcoming is not None:
        return (upcoming.name, None, None) if upcoming.kind == GATE_KIND else None
    if ctx._journal.recorded or spec.rate_limit is None:
        return None
    return spec.rate_limit, spec.rate_limit, spec.rate_limit_tokens


def admit(ctx: RunContext, spec: AgentSpec) -> None:
    """Before a synchronous agent runs: take (or replay) its run's grant.

    Raises:
        Suspend: no grant within the patience; the run sleeps until the window allows.
        UnknownRateLimit: the agent names a limit the App does not define.
    """
    gate = _gate(ctx, spec)
    if gate is not None:
        name, limit, tokens = gate
        ctx.step(GATE_KIND, name, _nothing, limit=limit, tokens=tokens)
        ctx._journal.opened()  # an agent resuming by hand may still skip ahead


async def admit_async(ctx: AsyncRunContext, spec: AgentSpec) -> None:
    """`admit` for an async agent: its tries on a store thread, its waits awaited."""
    gate = _gate(ctx.core, spec)
    if gate is not None:
        name, limit, tokens = gate
        await ctx.step(GATE_KIND, name, _nothing, limit=limit, tokens=tokens)
        ctx.core._journal.opened()
