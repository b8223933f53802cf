"""Lease holder names: who holds a run's lease (a worker, an interactive run, the reaper…)."""

from __future__ import annotations

import os
import socket
from uuid import uuid4


def holder_name(kind: str) -> str:
    """`<kind>:<host>:<pid>:<uuid>`: unique per process and per use, never just a host."""
    return f"{kind}:{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:12]}"
