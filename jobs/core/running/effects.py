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
from jobs.core.text import decoded


def once(connection: Redis, job_id: str, name: str, effect: Callable[[], Any], token: str = "1") -> bool:
    """Run ``effect`` unless it already ran (or is running) for this job; True if it ran now.

    The marker is set before the effect runs: a crash inside the effect means it is not
    repeated (at most once). If the effect raises, the marker is removed so a retry may try.
    ``token`` (the attempt's) is the marker's value: a marker set by a command whose reply a
    Redis blip lost is recognised as this caller's own when it asks again.
    """
    marker = keys.effect(job_id, name)
    if not _mark(connection, marker, token):
        return False
    try:
        effect()
    except BaseException:
        _forget(connection, marker)
        raise
    return True


def _mark(connection: Redis, marker: str, token: str) -> bool:
    """Set the marker (True), or find it set by someone else (False), riding out a blip: a SET
    whose reply was lost may have landed, so the question is asked again, and a marker holding
    this caller's token is its own."""
    deadline = time.monotonic() + settings().lease_seconds
    delay, retried = 0.1, False
    while True:
        try:
            if connection.set(marker, token, nx=True, ex=settings().result_ttl):
                return True
            return retried and token != "1" and decoded(connection.get(marker)) == token
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay, retried = min(delay * 2, 1.0), True


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

