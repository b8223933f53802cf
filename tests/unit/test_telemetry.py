"""The telemetry seam: no-op by default, composed observers each hear every hook."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from uuid import uuid4

import pytest

from steptrail.domain.enums import Outcome
from steptrail.domain.ports import ClaimedRun
from steptrail.domain.run import Run, trace_id_of
from steptrail.infrastructure.settings import Settings
from steptrail.runtime import _tracing
from steptrail.workers.telemetry import (
    NO_CREATION,
    NO_SEGMENT,
    NO_STEP,
    NO_TELEMETRY,
    CreationProbe,
    Fanout,
    SegmentProbe,
    StepEnd,
    StepProbe,
    Telemetry,
    compose,
)

REPO = Path(__file__).resolve().parents[2]
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Recorder(Telemetry):
    """A fake observer that writes down every hook it hears."""

    def __init__(self, name: str, heard: list[str], parent: str | None = None) -> None:
        self.name, self.heard, self.parent = name, heard, parent

    def run_created(self, *, agent: str, run_id: object, how: str) -> CreationProbe:
        recorder = self

        class Creation(CreationProbe):
            @property
            def trace_parent(self) -> str | None:
                return recorder.parent

            def ended(self, *, duplicate: bool = False) -> None:
                recorder.heard.append(f"{recorder.name}:created:{how}:{duplicate}")

        return Creation()

    def claimed(self, runs: Sequence[ClaimedRun], seconds: float) -> None:
        self.heard.append(f"{self.name}:claimed:{len(runs)}")

    def segment_started(self, run: Run) -> SegmentProbe:
        recorder = self

        class Step(StepProbe):
            def ended(self, end: StepEnd) -> None:
                recorder.heard.append(f"{recorder.name}:step_ended:{end.seq}")

            def close(self) -> None:
                recorder.heard.append(f"{recorder.name}:step_closed")

        class Segment(SegmentProbe):
            def step_started(self, kind: str, name: str, seq: int) -> StepProbe:
                recorder.heard.append(f"{recorder.name}:step:{kind}:{name}:{seq}")
                return Step()

            def step_replayed(self, kind: str, name: str, seq: int, *, failed: bool) -> None:
                recorder.heard.append(f"{recorder.name}:replayed:{seq}")

            def lease_renewed(self) -> None:
                recorder.heard.append(f"{recorder.name}:renewed")

            def lease_lost(self, cause: str) -> None:
                recorder.heard.append(f"{recorder.name}:lost:{cause}")

            def failed(self, failure_class: str, error_type: str) -> None:
                recorder.heard.append(f"{recorder.name}:failed:{failure_class}")

            def ended(self, outcome: Outcome | None) -> None:
                recorder.heard.append(f"{recorder.name}:ended:{outcome}")

        self.heard.append(f"{self.name}:segment")
        return Segment()


def a_run() -> Run:
    run = Run.enqueue(run_id=uuid4(), agent="a", request_digest="d", actor="t")
    run.mark_committed()
    return run


def test_default__observes_nothing_and_returns_the_shared_no_op_probes() -> None:
    """The base observer hands back the shared no-op probes, which accept every hook."""
    assert NO_TELEMETRY.run_created(agent="a", run_id=uuid4(), how="enqueue") is NO_CREATION
    assert NO_CREATION.trace_parent is None
    segment = NO_TELEMETRY.segment_started(a_run())
    assert segment is NO_SEGMENT
    assert segment.step_started("llm", "x", 1) is NO_STEP
    NO_STEP.ended(StepEnd(1))
    NO_STEP.close()
    segment.ended(Outcome.COMPLETED)


def test_compose__drops_absent_members_and_keeps_a_single_one_as_is() -> None:
    """compose() of nothing is the no-op; of one observer, that observer itself."""
    heard: list[str] = []
    one = Recorder("a", heard)
    assert compose(None, NO_TELEMETRY) is NO_TELEMETRY
    assert compose(None, one) is one
    assert isinstance(compose(one, Recorder("b", heard)), Fanout)


def test_fanout__every_member_hears_every_hook_and_steps_close_in_reverse() -> None:
    """Each hook reaches each member; probes close innermost-last-opened first."""
    heard: list[str] = []
    both = compose(Recorder("a", heard), Recorder("b", heard, parent=TRACEPARENT))
    creation = both.run_created(agent="x", run_id=uuid4(), how="enqueue")
    assert creation.trace_parent == TRACEPARENT
    creation.ended(duplicate=True)
    both.claimed([], 0.01)
    segment = both.segment_started(a_run())
    step = segment.step_started("llm", "plan", 1)
    step.ended(StepEnd(1))
    step.close()
    segment.step_replayed("llm", "plan", 1, failed=False)
    segment.lease_renewed()
    segment.lease_lost("taken_over")
    segment.failed("rate_limit", "HttpStatusError")
    segment.ended(Outcome.REQUEUED)
    assert heard == [
        "a:created:enqueue:True",
        "b:created:enqueue:True",
        "a:claimed:0",
        "b:claimed:0",
        "a:segment",
        "b:segment",
        "a:step:llm:plan:1",
        "b:step:llm:plan:1",
        "a:step_ended:1",
        "b:step_ended:1",
        "b:step_closed",
        "a:step_closed",
        "a:replayed:1",
        "b:replayed:1",
        "a:renewed",
        "b:renewed",
        "a:lost:taken_over",
        "b:lost:taken_over",
        "a:failed:rate_limit",
        "b:failed:rate_limit",
        "b:ended:requeued",
        "a:ended:requeued",
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (TRACEPARENT, "4bf92f3577b34da6a3ce929d0e0e4736"),
        (None, None),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
        ("00-not-hex-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01", None),
    ],
)
def test_trace_id_of__reads_only_valid_traceparents(
    value: str | None, expected: str | None
) -> None:
    """The trace id comes from a valid W3C traceparent; anything else gives None."""
    assert trace_id_of(value) == expected


def test_creation_event__carries_the_trace_parent_into_the_state() -> None:
    """The traceparent given at enqueue is in the Queued event and the folded state."""
    run = Run.enqueue(
        run_id=uuid4(), agent="a", request_digest="d", actor="t", trace_parent=TRACEPARENT
    )
    (queued,) = run.pending_events
    assert isinstance(queued, Run.Queued)
    assert queued.trace_parent == TRACEPARENT
    assert run.state.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_tracing__off_means_no_tracer_and_on_needs_the_api() -> None:
    """`tracing=off` wires no tracer; `auto` and `on` wire one when the API is installed."""
    assert _tracing(Settings(tracing="off"), None) is None
    assert _tracing(Settings(tracing="on"), None) is not None


def test_tracing__without_opentelemetry_runs_work_and_nothing_imports_it(tmp_path: Path) -> None:
    """With the opentelemetry package missing, `auto` wires no tracer, runs complete, and
    `opentelemetry` is never imported; `on` refuses to start."""
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if it were not installed
import steptrail
from steptrail.tracing import Tracing  # noqa: F401 -- must fail below, never reached
"""
    blocked = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert "ModuleNotFoundError" in blocked.stderr or "ImportError" in blocked.stderr
    script = f"""
import sys
sys.modules["opentelemetry"] = None
import steptrail
rt = steptrail.open(url="sqlite:///{tmp_path}/t.db", log_level="error")
run_id = rt.enqueue("scripted", {{"steps": 2}})
rt.work(burst=True)
print("OUT", rt.get(run_id).status.value, type(rt.metrics).__name__,
      hasattr(rt.telemetry, "members"))
rt.close()
try:
    steptrail.open(url="sqlite:///{tmp_path}/t.db", tracing="on")
except ValueError as error:
    print("OUT refused:", error)
loaded = [m for m, mod in sys.modules.items() if m.startswith("opentelemetry") and mod]
print("OUT", loaded)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = [line[4:] for line in done.stdout.splitlines() if line.startswith("OUT ")]
    assert lines[0] == "completed WorkerMetrics False"  # the metrics alone: no tracer
    assert lines[1].startswith("refused: tracing=on needs the OpenTelemetry API")
    assert lines[2] == "[]"


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # the all-zero trace id is invalid
        "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",  # not hex
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902-01",  # short span id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    ],
)
def test_parent_context__anything_but_a_traceparent_starts_no_parent(value: str | None) -> None:
    """A saved value that is not a W3C traceparent continues nothing (the segment starts a
    trace of its own) rather than failing the segment."""
    from steptrail.tracing import _parent_context

    assert _parent_context(value) is None


def test_parent_context__continues_the_saved_trace() -> None:
    from opentelemetry import trace

    from steptrail.tracing import _parent_context

    context = _parent_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    parent = trace.get_current_span(context).get_span_context()
    assert format(parent.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert format(parent.span_id, "016x") == "00f067aa0ba902b7"
    assert parent.is_remote
    assert parent.trace_flags.sampled
