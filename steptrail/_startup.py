"""The command line's start: automatic garbage collection waits while it imports (ADR 0051).

Starting a command allocates a few hundred thousand long-lived objects (modules, classes,
functions, pydantic schemas) and no garbage to speak of; with the collector on, CPython
traverses them in about a hundred collections, ~15 ms of a ~0.25 s start. `pause` turns
automatic collection off when the `steptrail` program starts; `resume` — once the command's
runtime is open, or when the command ends — moves what exists by then into the permanent
generation (`gc.freeze`, so later collections do not traverse it again) and turns collection
back on. Both do nothing for a host that merely imports steptrail: only the program pauses.
"""

from __future__ import annotations

import gc

_state = {"paused": False}


def pause() -> None:
    """Turn automatic garbage collection off until `resume`, if it is on."""
    if gc.isenabled():
        gc.disable()
        _state["paused"] = True


def resume() -> None:
    """Undo `pause` (after freezing what the start allocated); nothing if it did not pause."""
    if _state["paused"]:
        _state["paused"] = False
        gc.freeze()
        gc.enable()
