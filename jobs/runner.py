"""The function RQ runs for every leash job, inside the work-horse.

The worker claimed the job (an ``Attempt`` with a fencing token) before forking; this maps
how the kind's function ended onto a fenced transition, then lets RQ do its bookkeeping:

    returned         -> finish   (succeeded; refused if the lease was lost)
    PermanentError   -> fail     (failed at once)
    Canceled         -> fail     (failed, error "canceled")
    other exception  -> fail     (queued again while attempts remain, else failed)
    HandOff          -> release  (front of the queue, attempt not counted)
    LeaseLost        -> nothing  (another attempt owns the job; this one writes nothing)
"""

from __future__ import annotations

from typing import Any

from . import kinds
from .context import JobContext
from .errors import Canceled, HandOff, LeaseLost, PermanentError
from .lease import Attempt, describe

_current: Attempt | None = None


def set_current(attempt: Attempt | None) -> None:
    global _current
    _current = attempt


def current() -> Attempt | None:
    return _current


def execute(kind_name: str, payload: dict) -> dict[str, Any]:
    attempt = current()
    if attempt is None:
        raise RuntimeError("leash jobs run on `leash worker` (jobs.worker.LeashWorker), not a plain RQ worker")
    kind = kinds.get(kind_name)
    ctx = JobContext(attempt, payload)
    try:
        summary = kind.func(ctx, payload) or {}
        attempt.finish(summary)
        return summary
    except LeaseLost:
        attempt.outcome = "superseded"
        raise
    except HandOff:
        attempt.release()
        raise
    except Canceled:
        attempt.fail("canceled", permanent=True)
        raise
    except PermanentError as exc:
        attempt.fail(describe(exc), permanent=True)
        raise
    except Exception as exc:
        attempt.fail(describe(exc), permanent=False)
        raise
