"""Side effects that must happen at most once per job, however often the job runs.

A re-run after a reclaim, a zombie waking up, a replay: each may reach the line that sends
"your job is done". ``once`` lets the first caller through and no one after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
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
        _forget(connection, marker)
        raise
    return True


def _forget(connection: Redis, marker: str) -> None:
    """The effect raised: its marker goes, riding out a Redis blip for as long as a lease lasts
    -- an effect that failed because Redis was away (a restart, a failover) would otherwise
    leave its marker behind, and no later attempt would run it: the job would end with its
    side effect never run."""
    deadline = time.monotonic() + settings().lease_seconds
    delay = 0.1
    while True:
        try:
            connection.delete(marker)
            return
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

