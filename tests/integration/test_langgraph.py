"""LangGraph graphs made durable by steptrail, offline with `GenericFakeChatModel`, on both
backends: nodes as journaled steps, a crash after node 2 recovered without running nodes
1-2 again, `interrupt()` as a digest-bound approval or an input, the zombie's checkpoint
writes fenced, loud refusal outside a steptrail run."""

from __future__ import annotations

import operator
import os
from typing import Annotated, Any, TypedDict
from uuid import UUID

import pytest

# scripts/test installs the extra; under CI=true a missing extra fails at the import below.
if os.environ.get("CI", "").lower() != "true":
    pytest.importorskip("langgraph", reason="install the extra: pip install -e '.[langgraph]'")

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import steptrail
from examples.langgraph_review import Counters, review_app, review_graph
from steptrail.domain.decisions import PendingCall, calls_digest
from steptrail.domain.enums import Outcome, RunStatus
from steptrail.domain.errors import DigestMismatch, InvalidInput
from steptrail.domain.run import Run
from steptrail.integrations import langgraph as langgraph_integration
from steptrail.integrations.langgraph import NotInSteptrailRun, StepTrailSaver
from steptrail.runtime import Runtime
from steptrail.testing import Kit, crash_at, lose_lease_at
from tests.conftest import make_runtime

NODES = [("node", "research"), ("node", "draft"), ("node", "review")]


def steps(rt: Runtime, run_id: UUID) -> list[Run.StepRecorded]:
    return [h.event for h in rt.history(run_id) if isinstance(h.event, Run.StepRecorded)]


def without_ids(state: dict[str, Any]) -> dict[str, Any]:
    """The final state with the messages' generated ids left out (they differ per run)."""
    messages = [{k: v for k, v in m.items() if k != "id"} for m in state["messages"]]
    return {**state, "messages": messages}


def test_langgraph__nodes_are_steps_and_interrupt_waits_for_approval(db_url: str) -> None:
    """Each node is a `node` step; `interrupt()` suspends the run for an approval bound to
    the interrupt's exact value; a wrong digest is refused; the right one resumes without
    running the finished nodes again, and the write node runs once, behind its marker."""
    counters = Counters()
    rt = make_runtime(db_url, app=review_app(counters))
    try:
        run_id = rt.enqueue("review", {"topic": "tides"})
        assert rt.work(burst=True).outcomes == {"awaiting_approval": 1}
        assert [(s.kind, s.name) for s in steps(rt, run_id)] == NODES
        pending = rt.pending(run_id)
        expected = PendingCall(
            name="interrupt",
            arguments={"value": {"publish": "A short note on tides."}},
            id="interrupt-1",
        )
        assert pending.calls == [expected]
        assert pending.digest == calls_digest([expected])
        with pytest.raises(DigestMismatch):
            rt.approve(run_id, by="alice", digest="sha256:" + "0" * 64)
        assert rt.approve(run_id, by="alice", digest=pending.digest).outcome is Outcome.REQUEUED
        assert rt.work(burst=True).outcomes == {"completed": 1}
        assert [(s.kind, s.name) for s in steps(rt, run_id)] == [
            *NODES,
            ("decision", "approval"),
            ("node", "review"),
            ("tool", "publish"),
        ]
        assert counters.runs == {"research": 1, "draft": 1, "review": 2, "publish": 1}
        assert counters.outbox == ["A short note on tides."]
        trail = [type(h.event).__name__ for h in rt.history(run_id)]
        assert trail.count("EffectPending") == 1
        row = rt.get(run_id)
        assert row.status is RunStatus.COMPLETED
        assert row.state.pending_effects == ()
    finally:
        rt.close()


def test_langgraph__crash_after_node_2_recovers_without_running_it_again(db_url: str) -> None:
    """The process dies in node 3, after node 2's record is durable: the recovered run
    replays nodes 1-2 (not executed again), the interrupt is approved, the write runs once,
    and the final state equals an uncrashed run's."""
    clean = Counters()
    rt = make_runtime(db_url, app=review_app(clean))
    try:
        uncrashed = Kit(rt).run_to_end("review", {"topic": "tides"}, decide="approve")
    finally:
        rt.close()
    counters = Counters()
    rt = make_runtime(db_url, app=review_app(counters))
    try:
        crashed = Kit(rt).run_to_end(
            "review", {"topic": "tides"}, decide="approve", faults=[crash_at(3)]
        )
        assert crashed.crashes == 1
        assert crashed.status is RunStatus.COMPLETED
        assert (counters.runs["research"], counters.runs["draft"]) == (1, 1)
        assert counters.runs["publish"] == 1
        assert counters.outbox == ["A short note on tides."]
        assert without_ids(crashed.result) == without_ids(uncrashed.result)
        assert crashed.result["published"] == "A short note on tides."
        assert crashed.step_names().count("research") == 1
    finally:
        rt.close()


def test_langgraph__denial_reaches_the_node(db_url: str) -> None:
    """A denied interrupt resumes the node with `{"approved": False, ...}`: the graph goes
    on, and the write node publishes nothing."""
    counters = Counters()
    rt = make_runtime(db_url, app=review_app(counters))
    try:
        result = Kit(rt).run_to_end("review", {"topic": "tides"}, decide="deny")
        assert result.status is RunStatus.COMPLETED
        assert result.result["approved"] is False
        assert result.result["published"] == ""
        assert counters.outbox == []
    finally:
        rt.close()


class Booking(TypedDict, total=False):
    city: str
    nights: int


def booking_graph() -> StateGraph[Booking, Any, Booking, Booking]:
    def ask(state: Booking) -> dict[str, Any]:
        schema = {
            "type": "object",
            "properties": {"nights": {"type": "integer", "minimum": 1}},
            "required": ["nights"],
        }
        answer = interrupt("How many nights?", response_schema=schema)
        return {"nights": answer["nights"]}

    builder = StateGraph(Booking)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder


def test_langgraph__interrupt_with_a_schema_waits_for_input(db_url: str) -> None:
    """An interrupt with a JSON Schema `response_schema` waits for input; the submitted
    values (validated before anything changes) are what `interrupt()` returns."""
    app = steptrail.App()
    app.graph("book", booking_graph())
    rt = make_runtime(db_url, app=app)
    try:
        run_id = rt.enqueue("book", {"city": "Oslo"})
        assert rt.work(burst=True).outcomes == {"awaiting_input": 1}
        assert rt.pending(run_id).prompt == "How many nights?"
        with pytest.raises(InvalidInput):
            rt.submit_input(run_id, {"nights": 0}, by="carol")
        rt.submit_input(run_id, {"nights": 3}, by="carol")
        assert rt.work(burst=True).outcomes == {"completed": 1}
        decided = [s for s in steps(rt, run_id) if s.kind == "decision"]
        assert [s.name for s in decided] == ["input"]
        assert "3" not in str(decided[0].payload)  # input values never reach the log
    finally:
        rt.close()


def test_langgraph__graph_agent_defaults_its_concurrency_key(db_url: str) -> None:
    """`app.graph(..., concurrency_key=, concurrency_limit=)` keys the graph's runs as
    `@app.agent` does (ADR 0078)."""
    app = steptrail.App()
    app.graph("book", booking_graph(), concurrency_key="hotel:oslo", concurrency_limit=1)
    rt = make_runtime(db_url, app=app)
    try:
        state = rt.get(rt.enqueue("book", {"city": "Oslo"})).state
        assert (state.concurrency_key, state.concurrency_limit) == ("hotel:oslo", 1)
    finally:
        rt.close()


def test_langgraph__zombie_checkpoint_writes_are_fenced(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers drive one run: the first loses it to a reclaim while node 2 runs; its
    checkpoint write raises instead of landing, so node 2's update is stored only by the
    worker that took over (and the trail holds node 2 once)."""
    stored: list[tuple[str, str]] = []
    real = InMemorySaver.put_writes

    def spy(
        self: InMemorySaver, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        real(self, config, writes, task_id, task_path)
        run = langgraph_integration._CURRENT.get()
        assert run is not None
        stored.append((run.ctx.fencing_token, repr(writes)))

    monkeypatch.setattr(InMemorySaver, "put_writes", spy)
    counters = Counters()
    rt = make_runtime(db_url, app=review_app(counters))
    try:
        result = Kit(rt).run_to_end(
            "review", {"topic": "tides"}, decide="approve", faults=[lose_lease_at(2)]
        )
        outcomes = [s.outcome for s in result.segments]
        assert outcomes[0] is Outcome.LEASE_LOST
        assert result.status is RunStatus.COMPLETED
        assert counters.runs["draft"] == 2  # the zombie's run of node 2, and the real one
        assert result.step_names().count("draft") == 1  # only the real one was recorded
        zombie = [w for token, w in stored if token == stored[0][0]]
        assert len(zombie) == 2
        assert "three facts" in zombie[1]
        assert not any("A short note" in w for w in zombie)  # node 2's was refused
        assert any("A short note" in w for _, w in stored)  # and stored by the new worker
        assert counters.outbox == ["A short note on tides."]
    finally:
        rt.close()


def test_langgraph__refuses_outside_a_steptrail_run(runtime: Runtime) -> None:
    """A registered graph's nodes and checkpointer refuse to run outside a steptrail run; a
    graph compiled with its own checkpointer is refused at registration."""
    from steptrail.integrations.langgraph import _compile

    compiled = _compile(review_graph(Counters()))
    assert isinstance(compiled.checkpointer, StepTrailSaver)
    with pytest.raises(NotInSteptrailRun):
        compiled.invoke({"topic": "x"}, {"configurable": {"thread_id": "t"}})
    with pytest.raises(ValueError, match="checkpointer of its own"):
        steptrail.App().graph("g", review_graph(Counters()).compile(checkpointer=InMemorySaver()))
    with pytest.raises(TypeError):
        steptrail.App().graph("g", object())


def test_fence__appends_the_pending_record_and_refuses_after_a_loss(runtime: Runtime) -> None:
    """`ctx.fence()` makes the previous step's record durable now (it is in the trail
    before the next step starts) and raises `LeaseLost` once somebody else took the run."""
    from steptrail.workers.segment import LeaseLost

    seen: list[Any] = []
    app = steptrail.App()

    @app.agent("fenced")
    def fenced(ctx: steptrail.RunContext, request: dict[str, Any]) -> dict[str, Any]:
        ctx.step("llm", "one", lambda: 1)
        ctx.fence()
        seen.append([s.name for s in steps(runtime, ctx.run_id)])
        ctx.step("llm", "two", lambda: 2)  # the kit takes the run away as this one starts
        try:
            ctx.fence()
        except LeaseLost:
            seen.append("lost")
            raise
        return {}

    runtime.app.include(app)
    result = Kit(runtime).run_to_end("fenced", {}, faults=[lose_lease_at(2)])
    assert seen[0] == ["one"]
    assert seen[1] == "lost"
    assert result.segments[0].outcome is Outcome.LEASE_LOST
    assert result.status is RunStatus.COMPLETED


def test_integrations__share_one_refusal() -> None:
    """Every integration raises the same `NotInSteptrailRun` (catch it once)."""
    from steptrail.integrations import _common

    assert NotInSteptrailRun is _common.NotInSteptrailRun


class Number(TypedDict):
    n: int


def test_langgraph__a_subgraph_node_is_one_step_replayed_whole(db_url: str) -> None:
    """A compiled subgraph used as a node runs inside that node's step (its checkpoint
    writes fenced from LangGraph's threads without deadlocking the step); after a crash in
    the next node it is replayed, not run again."""
    runs: list[str] = []

    def inc(state: Number) -> dict[str, Any]:
        runs.append("inner")
        return {"n": state["n"] + 1}

    def outer(state: Number) -> dict[str, Any]:
        runs.append("outer")
        return {"n": state["n"] * 10}

    sub = StateGraph(Number)
    sub.add_node("inc", inc)
    sub.add_edge(START, "inc")
    sub.add_edge("inc", END)
    builder = StateGraph(Number)
    builder.add_node("sub", sub.compile())
    builder.add_node("outer", outer)
    builder.add_edge(START, "sub")
    builder.add_edge("sub", "outer")
    builder.add_edge("outer", END)
    app = steptrail.App()
    app.graph("nested", builder)
    rt = make_runtime(db_url, app=app)
    try:
        result = Kit(rt).run_to_end("nested", {"n": 1}, faults=[crash_at(2)])
        assert result.result == {"n": 20}
        assert runs == ["inner", "outer", "outer"]  # outer was in flight at the crash
        assert result.step_names() == ["sub", "outer"]
    finally:
        rt.close()


class Trail(TypedDict):
    log: Annotated[list[str], operator.add]


def test_langgraph__parallel_branches_recover_after_a_crash(db_url: str) -> None:
    """A fan-out (a → b, c → d) takes the journal one branch at a time; its checkpoint
    writes, some made from LangGraph's own threads, are fenced under the run; a crash in d
    recovers with a, b and c replayed."""
    runs: list[str] = []

    def node(name: str) -> Any:
        def run(state: Trail) -> dict[str, Any]:
            runs.append(name)
            return {"log": [name]}

        return run

    builder = StateGraph(Trail)
    for name in "abcd":
        builder.add_node(name, node(name))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("a", "c")
    builder.add_edge("b", "d")
    builder.add_edge("c", "d")
    builder.add_edge("d", END)
    app = steptrail.App()
    app.graph("fan", builder)
    rt = make_runtime(db_url, app=app)
    try:
        result = Kit(rt).run_to_end("fan", {"log": []}, faults=[crash_at(4)])
        assert result.status is RunStatus.COMPLETED
        assert sorted(result.result["log"]) == ["a", "b", "c", "d"]
        assert sorted(runs) == ["a", "b", "c", "d", "d"]  # d was in flight at the crash
    finally:
        rt.close()
