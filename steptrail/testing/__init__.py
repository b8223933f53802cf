"""steptrail's testing kit for your agents: a pytest plugin (`steptrail_kit`,
`steptrail_runtime` fixtures), runs driven to their end in the test process, time skipping,
fault injection, and replay checks against recorded runs. See the testing guide,
docs/guides/testing.md.
"""

from __future__ import annotations

from steptrail.testing.faults import (
    Fault,
    InjectedFailure,
    SimulatedCrash,
    crash_at,
    fail_at,
    lose_lease_at,
)
from steptrail.testing.kit import Kit, RunResult, TimeSkippingUnsupported
from steptrail.testing.replay import (
    ReplayVerdict,
    replay_check,
    replay_fixture,
    replay_run,
    save_fixture,
)

__all__ = [
    "Fault",
    "InjectedFailure",
    "Kit",
    "ReplayVerdict",
    "RunResult",
    "SimulatedCrash",
    "TimeSkippingUnsupported",
    "crash_at",
    "fail_at",
    "lose_lease_at",
    "replay_check",
    "replay_fixture",
    "replay_run",
    "save_fixture",
]
