"""The LangGraph app of the acceptance tests (`STEPTRAIL_APP=tests.acceptance.langgraph_app:app`):
the review graph of `examples/langgraph_review.py`, whose nodes also append a line per real
execution to the file `$REVIEW_LOG`, and whose `review` node hangs, once it has logged,
while the file `$REVIEW_HANG` exists (so a test can SIGKILL the worker in node 3, after
node 2's record is durable). LangGraph is imported with this module: only the workers of
these tests load it."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import steptrail
from examples.langgraph_review import Counters, review_graph


class _Logged(Counter[str]):
    """Node executions, each also appended to `$REVIEW_LOG` for the test's process."""

    def __setitem__(self, node: str, count: int) -> None:
        super().__setitem__(node, count)
        with Path(os.environ["REVIEW_LOG"]).open("a") as f:
            f.write(f"{node}\n")
        hang = os.environ.get("REVIEW_HANG")
        while node == "review" and hang and Path(hang).exists():
            time.sleep(0.05)


counters = Counters()
counters.runs = _Logged()

app = steptrail.App()
app.tool("publish", effect="non_idempotent_write")
# `full`: the final state is kept verbatim in the trail, for the test to compare.
app.graph("review", review_graph(counters), privacy="full")
