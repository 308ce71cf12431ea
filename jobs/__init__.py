"""leash's job lifecycle on RQ: enqueue, lease, worker, states, dead-letter.

Start reading at ``states`` (the state machine and the one function that decides state),
then ``lease`` (attempts and fencing), ``worker`` and ``runner`` (how an attempt runs and
ends), ``reaper`` (taking back expired leases). Key names: ``keys``; Lua: ``lua/``.

The names below are imported when first asked for, not with the package: ``import
jobs.config`` (the bottom layer, which every process reads first) then loads settings only,
not RQ, Redis or the model code (tests/test_layers.py holds it to that).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the module it comes from.
_PUBLIC = {"InvalidJob": "jobs.errors", "LeaseLost": "jobs.errors", "NoSuchJob": "jobs.errors",
           "PermanentError": "jobs.errors", "State": "jobs.core.states", "status": "jobs.core.states",
           "cancel": "jobs.core.control", "once": "jobs.core.running.effects", "kind": "jobs.kinds"}

__all__ = ["InvalidJob", "LeaseLost", "NoSuchJob", "PermanentError", "State", "cancel", "enqueue",
           "kind", "once", "status"]


def __getattr__(name: str) -> Any:
    if name == "enqueue":  # the module, callable as its function (jobs/enqueue.py says why)
        return importlib.import_module("jobs.enqueue")
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jobs' has no attribute {name!r}")


if TYPE_CHECKING:
    from jobs.core.control import cancel
    from jobs.core.running.effects import once
    from jobs.core.states import State, status
    from jobs.enqueue import enqueue
    from jobs.errors import InvalidJob, LeaseLost, NoSuchJob, PermanentError
    from jobs.kinds import kind
