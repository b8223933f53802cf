"""The Grafana dashboard in docs/grafana loads and asks only for metrics the workers export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from steptrail.worker_metrics import METRIC_NAMES, WorkerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "steptrail-workers.json"

# The part of Grafana's dashboard model (schemaVersion 39) this dashboard uses: what Grafana
# needs to import it (a title, a schema version, panels with an id, type and place on the
# 24-column grid; Prometheus targets with a refId and an expression).
GRID = {
    "type": "object",
    "required": ["x", "y", "w", "h"],
    "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "h": {"type": "integer", "minimum": 1},
    },
}
TARGET = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string", "minLength": 1},
        "legendFormat": {"type": "string"},
        "datasource": {"$ref": "#/$defs/datasource"},
    },
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {
        "datasource": {
            "type": "object",
            "required": ["type", "uid"],
            "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}},
        }
    },
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 30},
        "time": {"type": "object", "required": ["from", "to"]},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {"type": "object", "required": ["name", "type"]},
                }
            },
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos"],
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "type": {"enum": ["row", "timeseries", "bargauge", "stat", "table"]},
                    "title": {"type": "string", "minLength": 1},
                    "gridPos": GRID,
                    "targets": {"type": "array", "items": TARGET},
                    "datasource": {"$ref": "#/$defs/datasource"},
                },
                "if": {"properties": {"type": {"not": {"const": "row"}}}},
                "then": {"required": ["targets", "datasource"]},
            },
        },
    },
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def exported_series() -> set[str]:
    """Every series name a worker's registry can expose (histograms' and counters' suffixes
    included)."""
    names: set[str] = set()
    for family in WorkerMetrics().registry.collect():
        if family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
        elif family.type == "counter":
            names.add(f"{family.name}_total")
        else:
            names.add(family.name)
    return names


def queries(dashboard: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            found.append(query["query"] if isinstance(query, dict) else query)
    return found


def test_dashboard__matches_the_dashboard_schema(dashboard: dict[str, Any]) -> None:
    """The dashboard JSON validates against the dashboard model Grafana imports."""
    jsonschema.validate(dashboard, SCHEMA)


def test_dashboard__panels_have_unique_ids_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    """Panel ids are unique and no two panels share a grid cell."""
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & taken, panel["title"]
        taken |= cells


def test_dashboard__every_query_names_an_exported_metric(dashboard: dict[str, Any]) -> None:
    """Each query names at least one steptrail metric, and every steptrail metric it names
    is one a worker exports."""
    exported = exported_series()
    for expr in queries(dashboard):
        named = set(re.findall(r"\bsteptrail_[a-z_]+", expr))
        assert named, expr
        assert named <= exported, (expr, named - exported)


def test_dashboard__shows_every_worker_metric(dashboard: dict[str, Any]) -> None:
    """No worker metric is left off the dashboard."""
    text = " ".join(queries(dashboard))
    assert [name for name in METRIC_NAMES if name not in text] == []
