"""Side effects that must happen at most once per job, however often the job runs.

A re-run after a reclaim, a zombie waking up, a replay: each may reach the line that sends
"your job is done". ``once`` lets the first caller through and no one after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis import Redis

from jobs import keys
from jobs.config import settings


def once(connection: Redis, job_id: str, name: str, effect: Callable[[], Any]) -> bool:
    """Run ``effect`` unless it already ran (or is running) for this job; True if it ran now.

    The marker is set before the effect runs: a crash inside the effect means it is not
    repeated (at most once). If the effect raises, the marker is removed so a retry may try.
    """
    marker = keys.effect(job_id, name)
    if not connection.set(marker, "1", nx=True, ex=settings().result_ttl):
        return False
    try:
        effect()
    except BaseException:
        connection.delete(marker)
        raise
    return True

