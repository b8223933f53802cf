"""A LangGraph graph made durable by steptrail, offline (no API key): research and draft
with a model, ask a person, publish. Needs the `langgraph` extra.

    steptrail --app examples.langgraph_review:app enqueue review '{"topic": "tides"}'
    steptrail --app examples.langgraph_review:app work --burst    # waits at `review`
    steptrail --app examples.langgraph_review:app approve RUN_ID --by alice --digest sha256:...
    steptrail --app examples.langgraph_review:app work --burst    # publishes, completes

The model is LangGraph's `GenericFakeChatModel`; `Counters` counts what really ran, outside
the database, so the tests can prove a recovered run does not run a finished node again.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

import steptrail


class Review(TypedDict, total=False):
    topic: str
    messages: Annotated[list[AnyMessage], add_messages]
    approved: bool
    published: str


class Counters:
    """How often each node's body ran, and what was published (the graph's one write)."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.outbox: list[str] = []


def _model(text: str) -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=iter([AIMessage(content=text)]))


def review_graph(counters: Counters) -> StateGraph[Review, Any, Review, Review]:
    """research → draft → review (asks a person) → publish (a write)."""

    def research(state: Review) -> dict[str, Any]:
        counters.runs["research"] += 1
        question = HumanMessage(content=f"What matters about {state['topic']}?", id="question")
        answer = _model(f"{state['topic']}: three facts").invoke([question])
        return {"messages": [question, answer]}

    def draft(state: Review) -> dict[str, Any]:
        counters.runs["draft"] += 1
        return {
            "messages": [_model(f"A short note on {state['topic']}.").invoke(state["messages"])]
        }

    def review(state: Review) -> dict[str, Any]:
        counters.runs["review"] += 1
        # The run waits here for `steptrail approve/deny`, bound to this value's digest.
        decision = interrupt({"publish": state["messages"][-1].content})
        return {"approved": bool(decision["approved"])}

    def publish(state: Review) -> dict[str, Any]:
        counters.runs["publish"] += 1
        if not state.get("approved"):
            return {"published": ""}
        note = str(state["messages"][-1].content)
        counters.outbox.append(note)
        return {"published": note}

    builder = StateGraph(Review)
    builder.add_node("research", research)
    builder.add_node("draft", draft)
    builder.add_node("review", review)
    builder.add_node("publish", publish)
    builder.add_edge(START, "research")
    builder.add_edge("research", "draft")
    builder.add_edge("draft", "review")
    builder.add_edge("review", "publish")
    builder.add_edge("publish", END)
    return builder


# --8<-- [start:app]
def review_app(counters: Counters | None = None) -> steptrail.App:
    """An App with the graph registered as the agent `review`; `publish` is a write."""
    app = steptrail.App()
    app.tool("publish", effect="non_idempotent_write")  # the node runs as this tool
    app.graph("review", review_graph(counters or Counters()))
    return app


# --8<-- [end:app]


app = review_app()
