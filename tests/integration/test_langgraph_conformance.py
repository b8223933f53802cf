"""LangGraph's published checkpointer conformance suite (`langgraph-checkpoint-conformance`)
run against `StepTrailSaver` inside a steptrail run, on both backends: every write the
suite makes goes through the run's fence."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from typing import Any

import pytest

# scripts/test installs the extra; under CI=true a missing extra fails at the import below.
if os.environ.get("CI", "").lower() != "true":
    pytest.importorskip(
        "langgraph.checkpoint.conformance",
        reason="install the extra: pip install -e '.[langgraph]'",
    )

from langgraph.checkpoint.conformance import checkpointer_test, validate

import steptrail
from steptrail import RunContext
from steptrail.integrations import langgraph as integration
from steptrail.integrations.langgraph import StepTrailSaver
from tests.conftest import make_runtime


def conformance_app(reports: list[dict[str, Any]], fences: list[int]) -> steptrail.App:
    """An App whose one agent runs the whole suite with the run's fence in place."""
    app = steptrail.App()

    @checkpointer_test(name="StepTrailSaver")
    async def saver() -> AsyncGenerator[StepTrailSaver, None]:
        yield StepTrailSaver()

    @app.agent("conformance")
    def conformance(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        fence = ctx.fence

        def counted() -> None:
            fences.append(1)
            fence()

        ctx.fence = counted  # type: ignore[method-assign]
        token = integration._CURRENT.set(integration._GraphRun(ctx, frozenset()))
        try:
            report = asyncio.run(validate(saver))
        finally:
            integration._CURRENT.reset(token)
        reports.append(report.to_dict())
        return {"level": report.conformance_level()}

    return app


def test_langgraph__step_trail_saver_passes_the_conformance_suite(db_url: str) -> None:
    """Every capability the saver has (the base five, and what InMemorySaver adds) passes
    LangGraph's conformance suite, its writes fenced on the run."""
    reports: list[dict[str, Any]] = []
    fences: list[int] = []
    rt = make_runtime(db_url, app=conformance_app(reports, fences))
    try:
        rt.enqueue("conformance", {})
        assert rt.work(burst=True).outcomes == {"completed": 1}
    finally:
        rt.close()
    (report,) = reports
    failures = {
        name: result["failures"] for name, result in report["results"].items() if result["failures"]
    }
    assert failures == {}
    detected = {name for name, result in report["results"].items() if result["detected"]}
    assert {"put", "put_writes", "get_tuple", "list", "delete_thread"} <= detected
    assert report["conformance_level"] == "FULL", report
    assert len(fences) > 0
