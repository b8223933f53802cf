"""User projections without a database: the SQL handle's parameters, the runner's parking
of a failing projection, the public event module, and the projections guide's example."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import structlog

import steptrail
from steptrail import events
from steptrail.domain.run import EVENT_TYPES, Run
from steptrail.infrastructure.codec import decode_event, encode_event
from steptrail.infrastructure.feed import format_position, parse_position
from steptrail.infrastructure.user_sql import to_psycopg
from steptrail.projections.custom import Failure, ProjectionFailed
from steptrail.workers.projector import MAX_BACKOFF_S, Isolated, Projector

REPO = Path(__file__).resolve().parents[2]


def test_to_psycopg__rewrites_named_parameters_only() -> None:
    """`:name` becomes `%(name)s`; casts, quoted text and literal percent signs survive."""
    assert to_psycopg("SELECT :a, :b_2::text") == "SELECT %(a)s, %(b_2)s::text"
    assert to_psycopg("SELECT ':not', \"x:y\", 5 % 2 WHERE x LIKE 'a%'") == (
        "SELECT ':not', \"x:y\", 5 %% 2 WHERE x LIKE 'a%%'"
    )
    assert to_psycopg("SELECT '12:30'::time, :t") == "SELECT '12:30'::time, %(t)s"


def test_positions__round_trip_and_reject_garbage() -> None:
    """A printed feed position parses back; a bare id means transaction 0 (SQLite)."""
    assert parse_position(format_position((812, 40))) == (812, 40)
    assert parse_position("17") == (0, 17)
    for bad in ("x", "1:y", "-1:2", "", f"0:{2**63}"):
        with pytest.raises(ValueError, match="not a feed position"):
            parse_position(bad)


class FakeStore:
    """A projection store whose batches fail while `failing` is set."""

    name = "fake"

    def __init__(self) -> None:
        self.failing = True
        self.calls = 0

    def process_batch(self, limit: int = 1000) -> tuple[int, tuple[int, int]]:
        self.calls += 1
        if self.failing:
            failure = Failure((0, 5), None, "t", "ValueError: no", None, 1)
            raise ProjectionFailed(self.name, failure)
        return 3, (0, 8)


class FakeViews:
    def process_batch(self, limit: int = 1000) -> tuple[int, tuple[int, int]]:
        return 0, (0, 0)


def test_isolated__parks_a_failing_projection_with_doubling_backoff() -> None:
    """After a failure the projection is not tried until its backoff passed; the backoff
    doubles up to a cap and resets once a batch commits."""
    now = [100.0]
    store = FakeStore()
    runner = Isolated(store, log=structlog.get_logger(), clock=lambda: now[0])
    assert runner.process_batch(10) is None
    assert runner.process_batch(10) is None
    assert store.calls == 1  # parked
    now[0] += 1.0
    assert runner.process_batch(10) is None
    assert store.calls == 2
    assert runner.parked_until == now[0] + 2.0
    for _ in range(20):
        now[0] = runner.parked_until
        runner.process_batch(10)
    assert runner.parked_until - now[0] == MAX_BACKOFF_S
    store.failing = False
    now[0] = runner.parked_until
    assert runner.process_batch(10) == (3, (0, 8))
    assert runner.failures == 0


def test_projector__a_failing_projection_does_not_stop_the_views() -> None:
    """The runner's round goes on past a projection that raises."""
    projector = Projector(FakeViews(), projections=[FakeStore()])
    assert projector.run_once() == 0
    assert projector.run_projections_once() is False


def test_events__every_topic_is_public_and_stable() -> None:
    """`steptrail.events` exposes every event class under its short name, by stored topic."""
    assert dict(events.TOPICS) == EVENT_TYPES
    for topic, cls in events.TOPICS.items():
        if topic.startswith("tests."):
            continue  # this module's own example below
        assert topic == f"steptrail.Run.{cls.__name__}"
        assert getattr(events, cls.__name__) is cls
        assert events.topic_of(cls) == topic
    assert events.StepRecorded is Run.StepRecorded


class Measured(events.RunEvent):
    """An event whose payload changed: version 1 stored `tokens`, version 2 splits it."""

    TOPIC: ClassVar[str] = "tests.Measured"
    VERSION: ClassVar[int] = 2
    tokens_in: int
    tokens_out: int

    @classmethod
    def upcast(cls, data: dict[str, Any], from_version: int) -> dict[str, Any]:
        if from_version == 1:
            tokens = data.pop("tokens")
            return {**data, "tokens_in": tokens, "tokens_out": 0}
        return super().upcast(data, from_version)


def test_upcast__a_stored_old_payload_reaches_readers_in_the_current_shape() -> None:
    """The documented upcasting story: an old payload under a stable topic is upcast when
    read, so a projection only ever matches the current class."""
    stored_v1 = b'{"actor":"w","tokens":7}'
    event = decode_event(Measured.TOPIC, stored_v1)
    assert event == Measured(actor="w", tokens_in=7, tokens_out=0)
    topic, body = encode_event(event)
    assert (topic, decode_event(topic, body)) == (Measured.TOPIC, event)
    assert b'"_v":2' in body
    with pytest.raises(NotImplementedError, match="no upcaster"):
        decode_event(Measured.TOPIC, b'{"actor":"w","_v":0}')


def test_projections_guide__includes_the_example_projection() -> None:
    """The projections guide shows examples/cost_per_agent_day.py, the module the tests
    run, by including the file itself (pymdownx.snippets), so the two cannot differ."""
    guide = (REPO / "docs" / "guides" / "projections.md").read_text()
    assert '--8<-- "examples/cost_per_agent_day.py"' in guide
    assert (REPO / "examples" / "cost_per_agent_day.py").exists()


def test_app__registers_a_projection_class_once() -> None:
    """The class decorator instantiates the projection and names it."""
    app = steptrail.App()

    @app.projection("counts")
    class Counts(steptrail.Projection):
        tables = ("counts",)

        def apply(self, event: events.RunEvent, ctx: Any) -> None:
            """Nothing to fold for this test."""

    (registered,) = app.projections.values()
    assert isinstance(registered, Counts)
    assert registered.name == "counts"
    other = steptrail.App()
    other.include(app)
    assert other.projections == {"counts": registered}
