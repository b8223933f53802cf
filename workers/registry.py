"""What a deployment can run: its agents, its tools' declared effects, its error mappings.

An `App` is plain data, built at import time of the user's module without touching a
database; `steptrail --app module:attr` loads it and the runtime wires it to a store.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from steptrail.domain.classifier import Classifier
from steptrail.domain.concurrency import check_key, check_limit, check_pattern, limit_for
from steptrail.domain.enums import Effect, FailureClass, PrivacyLevel
from steptrail.domain.queues import DEFAULT_PRIORITY, DEFAULT_QUEUE, check_priority, check_queue
from steptrail.domain.rate_limits import (
    DEFAULT_MARGIN_S,
    InvalidRateLimit,
    RateLimit,
    UnknownRateLimit,
    check_estimate,
    check_name,
)
from steptrail.domain.run import RunEvent
from steptrail.domain.schedules import DEFAULT_GRACE_S, Missed, Schedule
from steptrail.domain.waits import check_signal_name
from steptrail.projections.custom import EventContext, FunctionProjection, Projection, Sql

if TYPE_CHECKING:
    from steptrail.workers.async_context import AsyncRunContext
    from steptrail.workers.context import RunContext

AgentResult = Mapping[str, Any] | None
SyncAgentFn = Callable[["RunContext", dict[str, Any]], AgentResult]
AsyncAgentFn = Callable[["AsyncRunContext", dict[str, Any]], Awaitable[AgentResult]]
AgentFn = SyncAgentFn | AsyncAgentFn
F = TypeVar("F", bound=AgentFn)
P = TypeVar("P")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class UnknownAgent(LookupError):
    """No agent is registered under that name."""


class UnknownQueue(ValueError):
    """No agent of the App defaults to that queue and it was not declared (ADR 0077)."""


@dataclass(frozen=True)
class AgentSpec:
    """A registered agent: its function and, optionally, its own privacy level, the pydantic
    model its requests must validate against before anything is written, the default
    timeout of its steps and the longest one segment of it may run (seconds; ADR 0015), and
    the queue and priority of its runs by default (ADR 0077)."""

    name: str
    fn: AgentFn
    privacy: PrivacyLevel | None = None
    request_model: type[BaseModel] | None = None
    step_timeout: float | None = None
    max_duration: float | None = None
    # Where its runs go and in which order the claim takes them when the enqueuer names
    # neither (ADR 0077).
    queue: str = DEFAULT_QUEUE
    priority: int = DEFAULT_PRIORITY
    # The concurrency key of its runs when the enqueuer names none, and the limit of keys
    # no `App.limit` pattern matches (ADR 0078).
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    # The rate limit each of its runs takes one grant of (with this many estimated tokens)
    # when its first segment starts, before the agent runs (ADR 0083).
    rate_limit: str | None = None
    rate_limit_tokens: int | None = None
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", is_async_callable(self.fn))


def is_async_callable(fn: object) -> bool:
    """Whether calling `fn` gives a coroutine: an `async def` function, a partial of one,
    or an object whose `__call__` is one. (A plain function that happens to return an
    awaitable is caught when it runs: the executor refuses to settle it.)"""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - the bound method, not callable()
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


class App:
    """A registry of agents, tools and failure mappings.

    Example:
        ```python
        app = steptrail.App()

        @app.agent("summarise")
        def summarise(ctx, request): ...

        @app.agent("research")               # async agents get an AsyncRunContext
        async def research(ctx, request): ...

        app.tool("send_email", effect="non_idempotent_write")
        app.classify(MyProviderTimeout, "connection")
        ```
    """

    def __init__(self) -> None:
        self._agents: dict[str, AgentSpec] = {}
        self._tools: dict[str, Effect] = {}
        self._projections: dict[str, Projection] = {}
        self._tool_timeouts: dict[str, float] = {}
        self._signal_schemas: dict[str, type[BaseModel]] = {}
        self._queues: set[str] = {DEFAULT_QUEUE}
        self._limits: dict[str, int] = {}  # key pattern -> limit, in declaration order
        self._schedules: dict[str, Schedule] = {}
        self._rate_limits: dict[str, RateLimit] = {}
        self.classifier = Classifier()

    def agent(
        self,
        name: str | None = None,
        *,
        privacy: PrivacyLevel | str | None = None,
        request_model: type[BaseModel] | None = None,
        step_timeout: float | None = None,
        max_duration: float | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = DEFAULT_PRIORITY,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_limit: str | None = None,
        rate_limit_tokens: int | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated function as the agent `name` (default: its own name).

        `step_timeout` is the default deadline of each of its steps (a tool's own default
        and `ctx.step(..., timeout=)` take precedence); `max_duration` is the longest one
        segment of a run may take before it stops and goes down the retry ladder (seconds).
        `queue` and `priority` are those of its runs when the enqueuer names none (ADR
        0077); the queue becomes one of the App's queues. `concurrency_key` is its runs'
        key when the enqueuer names none, `concurrency_limit` the limit of a key no
        `App.limit` pattern matches (ADR 0078). `rate_limit` names an `App.rate_limit`
        each run takes one grant of, with `rate_limit_tokens` estimated tokens, when it
        first starts and before the agent runs; without a grant the run sleeps on the timer
        `rate_limit:NAME` until the window allows (ADR 0083).
        """

        def register(fn: F) -> F:
            self.add_agent(
                name or str(getattr(fn, "__name__", "")),
                fn,
                privacy=privacy,
                request_model=request_model,
                step_timeout=step_timeout,
                max_duration=max_duration,
                queue=queue,
                priority=priority,
                concurrency_key=concurrency_key,
                concurrency_limit=concurrency_limit,
                rate_limit=rate_limit,
                rate_limit_tokens=rate_limit_tokens,
            )
            return fn

        return register

    def add_agent(
        self,
        name: str,
        fn: AgentFn,
        *,
        privacy: PrivacyLevel | str | None = None,
        request_model: type[BaseModel] | None = None,
        step_timeout: float | None = None,
        max_duration: float | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = DEFAULT_PRIORITY,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_limit: str | None = None,
        rate_limit_tokens: int | None = None,
    ) -> None:
        if not name or not name.strip():
            raise ValueError("an agent needs a name")
        check_queue(queue)
        check_priority(priority)
        if concurrency_key is not None:
            check_key(concurrency_key)
        if concurrency_limit is not None:
            check_limit(concurrency_limit)
        _check_run_limit(rate_limit, rate_limit_tokens, self._rate_limits)
        if name in self._agents and self._agents[name].fn is not fn:
            raise ValueError(f"agent {name!r} is registered twice")
        _check_seconds(step_timeout, "step_timeout")
        _check_seconds(max_duration, "max_duration")
        level = PrivacyLevel.parse(privacy) if privacy is not None else None
        self._agents[name] = AgentSpec(
            name=name,
            fn=fn,
            privacy=level,
            request_model=request_model,
            step_timeout=step_timeout,
            max_duration=max_duration,
            queue=queue,
            priority=priority,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
            rate_limit_tokens=rate_limit_tokens,
        )
        self._queues.add(queue)

    def limit(self, pattern: str, limit: int) -> None:
        """At most `limit` runs of a concurrency key matching `pattern` run at once, across
        every worker (ADR 0078). `*` matches any characters, `?` one; the most specific
        pattern matching a key wins (the most literal characters, then the first declared).
        Declaring a pattern again changes its limit for runs enqueued from then on."""
        self._limits[check_pattern(pattern)] = check_limit(limit)

    @property
    def limits(self) -> dict[str, int]:
        """The declared key patterns and their limits, in declaration order."""
        return dict(self._limits)

    def keying(self, agent: str, key: str | None = None) -> tuple[str | None, int | None]:
        """The (concurrency key, limit) of a new run of `agent`: the key given, else the
        agent's; its limit by `App.limit`'s most specific pattern, else the agent's
        `concurrency_limit`. (None, None) for a run without a key.

        Raises:
            UnknownAgent: no such agent.
            ValueError: a malformed key, or a key no limit applies to.
        """
        spec = self.get(agent)
        chosen = spec.concurrency_key if key is None else check_key(key)
        if chosen is None:
            return None, None
        found = limit_for(chosen, self._limits)
        if found is None:
            found = spec.concurrency_limit
        if found is None:
            raise ValueError(
                f"no concurrency limit for key {chosen!r}: declare one with "
                f"App.limit(pattern, n) or concurrency_limit= on agent {agent!r}"
            )
        return chosen, found

    def check_run_limit(self, agent: str) -> None:
        """Refuse a run of `agent` whose run-level rate limit the App does not define (or
        whose estimate no grant of it could hold), before anything is written (ADR 0083).

        Raises:
            UnknownAgent: no such agent.
            UnknownRateLimit: the agent names a rate limit the App does not define.
            InvalidRateLimit: its `rate_limit_tokens` exceed the limit's tokens.
        """
        spec = self.get(agent)
        if spec.rate_limit is None:
            return
        limit = self._rate_limits.get(spec.rate_limit)
        if limit is None:
            known = ", ".join(sorted(self._rate_limits)) or "none"
            raise UnknownRateLimit(
                f"agent {agent!r} takes rate limit {spec.rate_limit!r} when its runs start, "
                f"but no such limit is defined (App.rate_limit; defined: {known})"
            )
        limit.check_use(spec.rate_limit_tokens)

    def queue(self, name: str) -> None:
        """Declare the queue `name` (ADR 0077): runs may be enqueued to it and workers may
        serve it. 'default' and every agent's default queue are declared already."""
        self._queues.add(check_queue(name))

    @property
    def queues(self) -> list[str]:
        """The App's queues, sorted: 'default', those declared, the agents' defaults."""
        return sorted(self._queues)

    def check_queues(self, names: Iterable[str]) -> list[str]:
        """`names` if each is one of the App's queues; UnknownQueue naming the known ones."""
        names = list(names)
        known = ", ".join(self.queues)
        for name in names:
            try:
                check_queue(name)
            except ValueError as error:
                raise UnknownQueue(f"{error} (known: {known})") from None
            if name not in self._queues:
                raise UnknownQueue(f"unknown queue {name!r} (known: {known})")
        return names

    def placement(
        self, agent: str, queue: str | None = None, priority: int | None = None
    ) -> tuple[str, int]:
        """The (queue, priority) of a new run of `agent`: those given, else the agent's.

        Raises:
            UnknownAgent: no such agent.
            ValueError: a malformed queue name or priority out of range; UnknownQueue (a
                ValueError) for a queue the App does not know.
        """
        spec = self.get(agent)
        chosen = spec.queue if queue is None else queue
        self.check_queues([chosen])
        return chosen, check_priority(spec.priority if priority is None else priority)

    def tool(
        self, name: str, *, effect: Effect | str = Effect.READ_ONLY, timeout: float | None = None
    ) -> None:
        """Declare a tool's effect (and, optionally, the default deadline of its calls, in
        seconds). Declared without an effect it is read-only; a tool nobody declared is
        treated as a non-idempotent write (the safe assumption).

        An `idempotent_write` tool whose result was not recorded (its worker died while it
        ran) runs again on the next segment; give the outside system `ctx.idempotency_key`
        so that the second call is a no-op there. A `non_idempotent_write` never runs again
        without a recorded result: its run is dead-lettered instead (ADR 0014)."""
        _check_seconds(timeout, "timeout")
        self._tools[name] = Effect(effect)
        if timeout is None:
            self._tool_timeouts.pop(name, None)
        else:
            self._tool_timeouts[name] = timeout

    def signal(self, name: str, *, schema: type[BaseModel]) -> None:
        """Declare the payload of the signal `name` (ADR 0073): a delivery whose payload
        does not validate against `schema` is refused before anything is written, and the
        stored payload is the model's JSON form."""
        check_signal_name(name)
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise TypeError("a signal's schema is a pydantic model class")
        self._signal_schemas[name] = schema

    def schedule(
        self,
        cron: str,
        agent: str,
        *,
        request: Mapping[str, Any] | None = None,
        name: str | None = None,
        missed: Missed | str = Missed.SKIP,
        grace_seconds: float = DEFAULT_GRACE_S,
    ) -> Schedule:
        """Run `agent` with `request` at every tick of `cron` (ADR 0076): 5 fields (minute,
        hour, day of month, month, day of week, in UTC) or 6 with leading seconds.

        Every tick enqueues exactly one run, however many workers run the scheduler (its
        idempotency key is the schedule's name and the tick). A tick at most
        `grace_seconds` old when a scheduler sees it runs; older ones were missed (nothing
        ran a scheduler): `missed="skip"` drops them, `"latest"` runs the newest of them
        once. `name` (default: the agent's; give one to schedule an agent twice) identifies
        the schedule in the store and in `steptrail schedules`; `steptrail work` stores the
        definitions when it starts.

        Raises:
            InvalidSchedule: a bad name, cron expression, policy or grace; nothing kept.
            ValueError: another schedule already has that name.
        """
        schedule = Schedule(
            name=name if name is not None else agent,
            cron=cron.strip() if isinstance(cron, str) else cron,
            agent=agent,
            request=dict(request or {}),
            missed=missed,  # type: ignore[arg-type]  # checked (and converted) by Schedule
            grace_s=grace_seconds,
        )
        if schedule.name in self._schedules and self._schedules[schedule.name] != schedule:
            raise ValueError(
                f"a schedule named {schedule.name!r} is already defined (give this one a name=)"
            )
        self._schedules[schedule.name] = schedule
        return schedule

    @property
    def schedules(self) -> dict[str, Schedule]:
        """The schedules this app defines, by name."""
        return dict(self._schedules)

    def rate_limit(
        self,
        name: str,
        *,
        requests: int | None = None,
        tokens: int | None = None,
        per: float,
        margin: float = DEFAULT_MARGIN_S,
    ) -> RateLimit:
        """Define rate limit `name`, shared by every worker of every machine (ADR 0080): at
        most `requests` steps and `tokens` estimated tokens in any `per` seconds (either or
        both). Steps consume it with `ctx.llm(..., limit=name, tokens=estimate)` (or
        `ctx.step`); every worker stores the definition when it starts. The store judges a
        window of `per + margin` seconds: `margin` (default 0.2 s) covers the time between
        the store's grant and the call reaching the provider.

        Raises:
            InvalidRateLimit: a bad value (nothing is defined), or another definition of
                the same name.
        """
        limit = RateLimit(name, requests, tokens, per, margin)
        self._add_rate_limit(limit)
        return limit

    def _add_rate_limit(self, limit: RateLimit) -> None:
        if self._rate_limits.get(limit.name, limit) != limit:
            raise InvalidRateLimit(f"a rate limit named {limit.name!r} is already defined")
        self._rate_limits[limit.name] = limit

    @property
    def rate_limits(self) -> dict[str, RateLimit]:
        """The rate limits this app defines, by name."""
        return dict(self._rate_limits)

    @property
    def signal_schemas(self) -> dict[str, type[BaseModel]]:
        """The declared signal payloads, by name."""
        return dict(self._signal_schemas)

    def graph(
        self,
        name: str,
        graph: Any,
        *,
        privacy: PrivacyLevel | str | None = None,
        step_timeout: float | None = None,
        max_duration: float | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = DEFAULT_PRIORITY,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_limit: str | None = None,
        rate_limit_tokens: int | None = None,
    ) -> None:
        """Register a LangGraph `StateGraph` (or a graph compiled without a checkpointer) as
        the agent `name`: its request is the graph's input, its result the final state, each
        node a journaled step, `interrupt()` a decision (ADR 0071; needs the `langgraph`
        extra, imported only here). `queue`, `priority`, `concurrency_key`,
        `concurrency_limit`, `rate_limit` and `rate_limit_tokens` as for `agent`."""
        from steptrail.integrations.langgraph import graph_agent

        self.add_agent(
            name,
            graph_agent(graph, self),
            privacy=privacy,
            step_timeout=step_timeout,
            max_duration=max_duration,
            queue=queue,
            priority=priority,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
            rate_limit_tokens=rate_limit_tokens,
        )

    def classify(self, exc_type: type[BaseException], failure_class: FailureClass | str) -> None:
        """Map one of your exception types (and its subclasses) to a failure class."""
        self.classifier.register(exc_type, failure_class)

    def projection(
        self,
        name: str,
        *,
        tables: Sequence[str] = (),
        create_tables: Callable[[Sql], None] | None = None,
        topics: Sequence[str] = (),
    ) -> Callable[[P], P]:
        """Register the decorated projection under `name`.

        Decorate a `steptrail.Projection` subclass (instantiated once, without arguments),
        or a function `apply(event, ctx)` — then pass `tables` and `create_tables` here.
        """

        def register(target: P) -> P:
            if isinstance(target, type) and issubclass(target, Projection):
                instance = target()
            elif callable(target):
                if create_tables is None:
                    raise ValueError(f"projection {name!r}: a function needs create_tables=")
                fn: Callable[[RunEvent, EventContext], None] = target
                instance = FunctionProjection(
                    name, fn, tables=tables, create_tables=create_tables, topics=topics
                )
            else:
                raise TypeError(f"projection {name!r}: not a Projection class or a function")
            self.add_projection(name, instance)
            return target

        return register

    def add_projection(self, name: str, projection: Projection) -> None:
        """Register a projection object under `name` (sets its `name`)."""
        if not name or not _IDENTIFIER.fullmatch(name):
            raise ValueError(f"a projection name is letters, digits and _ only, not {name!r}")
        if name in ("reporting", "run-index", "all"):
            raise ValueError(f"{name!r} is a built-in view's name")
        known = self._projections.get(name)
        if known is not None and known is not projection:
            raise ValueError(f"projection {name!r} is registered twice")
        if not projection.tables:
            raise ValueError(f"projection {name!r} must name its tables (for rebuild/verify)")
        for table in projection.tables:
            if not _IDENTIFIER.fullmatch(table) or table.lower().startswith("steptrail_"):
                raise ValueError(f"projection {name!r}: {table!r} is not a table it may own")
        projection.name = name
        self._projections[name] = projection

    @property
    def projections(self) -> dict[str, Projection]:
        """Every registered projection, by name."""
        return dict(self._projections)

    def include(self, other: App) -> None:
        """Add every agent, tool and mapping of `other` (for reusable agent packs)."""
        for spec in other._agents.values():
            self.add_agent(
                spec.name,
                spec.fn,
                privacy=spec.privacy,
                request_model=spec.request_model,
                step_timeout=spec.step_timeout,
                max_duration=spec.max_duration,
                queue=spec.queue,
                priority=spec.priority,
                concurrency_key=spec.concurrency_key,
                concurrency_limit=spec.concurrency_limit,
                rate_limit=spec.rate_limit,
                rate_limit_tokens=spec.rate_limit_tokens,
            )
        self._queues.update(other._queues)
        for pattern, n in other._limits.items():
            self._limits.setdefault(pattern, n)
        self._tools.update(other._tools)
        for name, projection in other._projections.items():
            self.add_projection(name, projection)
        self._tool_timeouts.update(other._tool_timeouts)
        self._signal_schemas.update(other._signal_schemas)
        for schedule in other._schedules.values():
            if self._schedules.get(schedule.name, schedule) != schedule:
                raise ValueError(f"a schedule named {schedule.name!r} is already defined")
            self._schedules[schedule.name] = schedule
        for limit in other._rate_limits.values():
            self._add_rate_limit(limit)
        for exc_type, failure_class in other.classifier._mappings.items():
            self.classifier.register(exc_type, failure_class)

    @property
    def declared_tools(self) -> frozenset[str]:
        """The names of the tools declared with `tool(...)`."""
        return frozenset(self._tools)

    def effect_of(self, tool: str) -> Effect:
        return self._tools.get(tool, Effect.NON_IDEMPOTENT_WRITE)

    def timeout_of(self, tool: str) -> float | None:
        """The declared default deadline of `tool`'s calls, in seconds, if any."""
        return self._tool_timeouts.get(tool)

    def get(self, name: str) -> AgentSpec:
        try:
            return self._agents[name]
        except KeyError:
            known = ", ".join(sorted(self._agents)) or "none"
            raise UnknownAgent(f"unknown agent {name!r} (registered: {known})") from None

    @property
    def agent_names(self) -> list[str]:
        return sorted(self._agents)


def _check_run_limit(
    name: str | None, tokens: int | None, defined: Mapping[str, RateLimit]
) -> None:
    """An agent's run-level limit as written: a well-formed name, tokens only with it, and
    a limit already defined must be able to hold them (one defined later is checked at
    enqueue, `App.check_run_limit`)."""
    if name is None:
        if tokens is not None:
            raise InvalidRateLimit("rate_limit_tokens= estimates a run's use: give rate_limit=")
        return
    check_name(name)
    check_estimate(tokens, "rate_limit_tokens=")
    limit = defined.get(name)
    if limit is not None:
        limit.check_use(tokens)


def _check_seconds(value: float | None, what: str) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{what} must be a positive number of seconds")
