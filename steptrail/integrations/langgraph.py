"""LangGraph graphs made durable by steptrail (`pip install 'steptrail[langgraph]'`).

`app.graph("name", builder)` registers a `StateGraph` (a builder, or a graph compiled
without a checkpointer of its own) as a synchronous steptrail agent: the run's request is
the graph's input, its result the graph's final state. The rules that make it durable
(ADR 0071):

* **A node is a step.** Every node runs as one journaled step of the run (kind `node`,
  its name), matched on replay by the node's name and LangGraph's superstep number; its
  state update is journaled in LangGraph's own serialisation, so a recovered run hands a
  finished node's update back instead of running the node again, whatever objects
  (messages, documents) it holds. Model calls inside a node are part of its step: a node
  that finished is never paid for twice; a node the worker died in runs again, whole, like
  any step in flight. A model's token usage in the update counts into the run's totals.
* **A node named like a declared tool is that tool.** A node whose name was declared with
  `app.tool(name, effect=...)` runs as `ctx.tool(name, ...)`: a write gets its
  pending-effect marker before it runs and its result is appended the moment it returns.
* **Checkpoints come from the journal.** The graph is compiled with `StepTrailSaver`, a
  checkpointer that keeps the run's checkpoints in the segment's memory: a later segment
  rebuilds them by replaying the node steps, so no checkpoint is stored twice. Each `put`
  and `put_writes` first appends the run's pending records fenced on its version: a zombie
  worker's `put` raises `LeaseLost` and nothing it computed after losing the run is seen.
* **`interrupt()` is a decision.** When the graph stops on interrupts, the run waits for a
  person: an interrupt whose `response_schema` is a JSON Schema waits for input
  (`steptrail input`), any other for an approval (`steptrail approve/deny`) bound to the
  SHA-256 digest of the interrupt's exact values. The node gets the decision back through
  `Command(resume=...)`: the submitted values, or `{"approved": bool, "by": who}`.

Outside a steptrail run the graph refuses to run (`NotInSteptrailRun`). Limits: the graph
runs with `invoke` in a synchronous agent (async-only nodes are not supported); parallel
branches of one superstep take the journal in the order they finish, and a different order
on replay fails the run `non_deterministic` rather than mix results; static breakpoints
(`interrupt_before/after`) are refused. A compiled subgraph used as a node runs inside
that node's one step.

Example (offline, no API key): `steptrail/integrations/langgraph_example.py`.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.errors import GraphInterrupt
from langgraph.graph import StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Interrupt
from langgraph.types import _interrupt_id as interrupt_id  # pinned: how LangGraph ids them

from steptrail.integrations._common import (
    NotInSteptrailRun,
    pending_call,
    refusal,
    require_sync_context,
)
from steptrail.workers.context import Recorded, RunContext, jsonable

if TYPE_CHECKING:
    from steptrail.workers.registry import App

__all__ = ["NotInSteptrailRun", "StepTrailSaver", "graph_agent"]

NODE_STEP = "node"
_SERDE = JsonPlusSerializer()
_CURRENT: ContextVar[_GraphRun | None] = ContextVar("steptrail_langgraph_run", default=None)
# LangGraph's configurable keys (`langgraph._internal._constants`, pinned).
_NS, _SCRATCHPAD = "checkpoint_ns", "__pregel_scratchpad"


@dataclass
class _GraphRun:
    """The steptrail run a graph is executing in, as its nodes and checkpointer find it."""

    ctx: RunContext
    tools: frozenset[str]
    # Nodes of one superstep may run on LangGraph's threads; the run's context is not
    # thread-safe, so its steps are taken one at a time. (Checkpoint writes do not take
    # it: a fence only appends, under the segment's own lock, and a subgraph inside a node
    # writes its checkpoints from LangGraph's threads while its parent node's step holds
    # this one.)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def _current(what: str) -> _GraphRun:
    run = _CURRENT.get()
    if run is None:
        raise NotInSteptrailRun(refusal(what, "a steptrail run (register it with app.graph)"))
    return run


class StepTrailSaver(InMemorySaver):
    """The checkpointer of a graph registered with `app.graph`: checkpoints kept in the
    segment's memory (rebuilt from the journal by replay), every write fenced on the run.

    `put` and `put_writes` (and their async twins, which call them) first append the run's
    pending step records, fenced on its version, so a checkpoint exists only once the node
    updates it follows from are durable, and a worker that lost the run gets `LeaseLost`
    instead of saving anything. Reads (`get_tuple`, `list`) and `delete_thread` are
    LangGraph's in-memory ones. Outside a steptrail run it refuses every write.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._runs: dict[str, _GraphRun] = {}

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._fence(config, "StepTrailSaver.put")
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._fence(config, "StepTrailSaver.put_writes")
        super().put_writes(config, writes, task_id, task_path)

    def bind(self, thread: str, run: _GraphRun) -> None:
        """Write `thread`'s checkpoints under `run` (until `unbind`)."""
        self._runs[thread] = run

    def unbind(self, thread: str) -> None:
        """Forget `thread`: its run's segment has ended, and its checkpoints with it."""
        self._runs.pop(thread, None)
        self.delete_thread(thread)

    def _fence(self, config: RunnableConfig, what: str) -> None:
        # The run is found by the thread (LangGraph writes some checkpoints from threads
        # its context variables do not reach), else by the context (a saver driven by
        # hand inside a run). Thread-safe without the run's lock: `fence` is an append
        # under the segment's own lock and touches nothing of the journal cursor.
        thread = str(config.get("configurable", {}).get("thread_id", ""))
        run = self._runs.get(thread) or _current(what)
        run.ctx.fence()


# -- nodes ---------------------------------------------------------------------------------


def _dump(value: Any) -> dict[str, str]:
    kind, data = _SERDE.dumps_typed(value)
    return {"serde": kind, "data": base64.b64encode(data).decode("ascii")}


def _load(value: Mapping[str, str]) -> Any:
    return _SERDE.loads_typed((value["serde"], base64.b64decode(value["data"])))


def _tokens(update: Any) -> int:
    """Tokens of the model messages a node's update carries (`usage_metadata`)."""
    values = update.values() if isinstance(update, Mapping) else ()
    total = 0
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            usage = getattr(item, "usage_metadata", None)
            if isinstance(usage, Mapping):
                total += int(usage.get("total_tokens") or 0)
    return total


def _attempt(node: Any, state: Any, config: RunnableConfig) -> Recorded[dict[str, Any]]:
    """Run the user's node once: its update, or the interrupts it stopped on (journaled
    too, so a replay stops the graph at the same place)."""
    try:
        update = node.invoke(state, config)
    except GraphInterrupt as paused:
        scratchpad = config.get("configurable", {}).get(_SCRATCHPAD)
        answered = len(getattr(scratchpad, "resume", ()) or ())
        interrupts = [
            {"value": _dump(i.value), "schema": jsonable(i.response_schema)} for i in paused.args[0]
        ]
        return Recorded(
            {"interrupts": interrupts, "answered": answered}, payload={"interrupted": True}
        )
    return Recorded({"update": _dump(update)}, tokens=_tokens(update))


def _outcome(value: Mapping[str, Any], config: RunnableConfig) -> Any:
    """What the node gives LangGraph: the update, or the interrupts raised again (ids as
    LangGraph gives them in this execution, so `Command(resume={id: ...})` matches)."""
    if "interrupts" not in value:
        return _load(value["update"])
    namespace = str(config.get("configurable", {}).get(_NS, ""))
    answered = int(value["answered"])
    raise GraphInterrupt(
        tuple(
            Interrupt(
                value=_load(i["value"]),
                id=interrupt_id(namespace, answered),
                response_schema=i["schema"],
            )
            for i in value["interrupts"]
        )
    )


def _durable_node(name: str, node: Any) -> Any:
    from langgraph._internal._runnable import RunnableCallable  # how LangGraph wraps nodes

    def durable(state: Any, config: RunnableConfig) -> Any:
        run = _current(f"the LangGraph node {name!r}")
        superstep = config.get("metadata", {}).get("langgraph_step")

        def attempt() -> Recorded[dict[str, Any]]:
            return _attempt(node, state, config)

        value: dict[str, Any]
        with run.lock:
            if name in run.tools:
                value = run.ctx.tool(name, attempt, arguments={"superstep": superstep})
            else:
                value = run.ctx.step(NODE_STEP, name, attempt, args={"superstep": superstep})
        return _outcome(value, config)

    return RunnableCallable(durable, name=name, trace=False)


def _compile(graph: Any) -> CompiledStateGraph[Any, Any, Any, Any]:
    if isinstance(graph, CompiledStateGraph):
        if graph.checkpointer not in (None, False):
            raise ValueError(
                "app.graph: this graph was compiled with a checkpointer of its own; steptrail "
                "is its checkpointer (pass the builder, or compile without one)"
            )
        if graph.interrupt_before_nodes or graph.interrupt_after_nodes:
            raise ValueError("app.graph: static breakpoints are not supported; use interrupt()")
        builder, name, store = graph.builder, graph.name, graph.store
    elif isinstance(graph, StateGraph):
        builder, name, store = graph, None, None
    else:
        raise TypeError(f"app.graph takes a StateGraph or its compiled graph, not {graph!r}")
    durable = copy.copy(builder)
    durable.nodes = {
        node: dataclasses.replace(spec, runnable=_durable_node(node, spec.runnable))
        for node, spec in builder.nodes.items()
    }
    return durable.compile(checkpointer=StepTrailSaver(), store=store, name=name or "LangGraph")


# -- the agent -----------------------------------------------------------------------------


def graph_agent(graph: Any, app: App) -> Callable[[RunContext, dict[str, Any]], dict[str, Any]]:
    """The steptrail agent function that runs `graph` durably (what `app.graph` registers).

    Raises:
        TypeError, ValueError: `graph` is not a StateGraph, or compiled in a way steptrail
            cannot make durable (its own checkpointer, static breakpoints).
    """
    compiled = _compile(graph)

    def run_graph(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx = require_sync_context(ctx, "a graph registered with app.graph")
        thread = str(ctx.run_id)
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        with _running(_GraphRun(ctx, app.declared_tools), compiled, thread):
            # "sync": every checkpoint write is done (and fenced) before the next superstep.
            state = compiled.invoke(request, config, durability="sync")
            while interrupts := _interrupts(state):
                resume = _decide(ctx, interrupts, state)
                state = compiled.invoke(Command(resume=resume), config, durability="sync")
        final: dict[str, Any] = jsonable(state)
        return final

    run_graph.__name__ = run_graph.__qualname__ = f"graph_{compiled.name}"
    return run_graph


@contextmanager
def _running(run: _GraphRun, compiled: Any, thread: str) -> Iterator[None]:
    saver: StepTrailSaver = compiled.checkpointer
    token = _CURRENT.set(run)
    saver.bind(thread, run)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        # The segment's checkpoints die with it: the next one rebuilds them by replay.
        saver.unbind(thread)


def _interrupts(state: Any) -> list[Interrupt]:
    if isinstance(state, Mapping):
        return list(state.get("__interrupt__") or ())
    return []


def _decide(ctx: RunContext, interrupts: list[Interrupt], state: Any) -> Any:
    """Wait for the person's answer to `interrupts` (replayed once taken); the resume."""
    shown = {k: v for k, v in dict(state).items() if k != "__interrupt__"}
    conversation = {"langgraph_state": jsonable(shown)}
    schema = interrupts[0].response_schema
    if len(interrupts) == 1 and isinstance(schema, Mapping):
        value = interrupts[0].value
        prompt = value if isinstance(value, str) else None
        return ctx.request_input(schema, prompt=prompt, conversation=conversation)
    # The call ids are positions, not LangGraph's ids (which change with every execution),
    # so a replay asks for the same digest; the values are what the person decides on.
    calls = [
        pending_call("interrupt", {"value": i.value}, f"interrupt-{k}")
        for k, i in enumerate(interrupts, 1)
    ]
    decision = ctx.request_approval(calls, conversation=conversation)
    answer = {"approved": decision.approved, "by": decision.by}
    if len(interrupts) == 1:
        return answer
    return {i.id: answer for i in interrupts}
