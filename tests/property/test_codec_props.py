"""An event's stored bytes: `encode_event` calls the class's serializer directly (ADR 0055),
and what it writes is byte for byte what `model_dump_json` gives, and reads back whole."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from steptrail.domain.enums import PrivacyLevel
from steptrail.domain.run import EVENT_TYPES, Run, RunEvent
from steptrail.infrastructure.codec import decode_event, encode_event

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
payloads = st.dictionaries(
    st.text(),
    st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=12,
    ),
    max_size=5,
)
steps = st.builds(
    Run.StepRecorded,
    actor=st.text(),
    seq=st.integers(min_value=1),
    kind=st.text(),
    name=st.text(),
    duration_ms=st.integers(min_value=0),
    payload=payloads,
    privacy=st.sampled_from(PrivacyLevel),
    error_type=st.none() | st.text(),
    tokens=st.integers(min_value=0),
    cost=st.floats(min_value=0, allow_nan=False, allow_infinity=False),
)
# The run's own events (other tests register classes of their own, with upcasters).
RUN_EVENTS = [cls for topic, cls in EVENT_TYPES.items() if topic.startswith("steptrail.Run.")]
every_event = st.one_of(*(st.builds(cls) for cls in RUN_EVENTS))


def _as_before(event: RunEvent) -> tuple[str, bytes]:
    """What `encode_event` wrote before ADR 0055 (for a current class version)."""
    return event.TOPIC, event.model_dump_json().encode("utf-8")


@given(steps)
def test_encode_event__a_step_is_the_bytes_model_dump_json_gives(event: Any) -> None:
    assert encode_event(event) == _as_before(event)
    assert decode_event(*encode_event(event)) == event


def test_run_events__are_all_current_and_all_covered() -> None:
    """Every event class the run defines is at version 1 (no `_v` to add) and generated."""
    assert len(RUN_EVENTS) == 21  # with the waits (ADR 0073) and PriorityChanged (ADR 0077)
    assert all(cls.VERSION == 1 for cls in RUN_EVENTS)


@given(every_event)
def test_encode_event__every_event_class_is_the_bytes_model_dump_json_gives(
    event: RunEvent,
) -> None:
    assert encode_event(event) == _as_before(event)
    assert decode_event(*encode_event(event)) == event
