""""Look now" on a batch job waiting at its provider: its look, parked in RQ's scheduled
registry until it is due, is made due now; RQ's scheduler queues it within a second or so, and
the look runs as every look does (claimed like any look, fenced, counted nowhere as an attempt).
Only ever earlier (ZADD XX LT): a look already due or under way is left as it is."""

from __future__ import annotations

from redis import Redis

from jobs import keys
from jobs.core import clock
from jobs.core.text import decoded


def look_now(connection: Redis, job_id: str, now: float | None = None) -> bool:
    """Whether the job's look is now due (False: RQ holds no scheduled look for it)."""
    now = clock.wall() if now is None else now
    queue = decoded(connection.hget(keys.job(job_id), "queue"))
    if not queue:
        return False
    registry = keys.rq_scheduled(queue, connection)
    connection.zadd(registry, {job_id: now}, xx=True, lt=True)
    score = connection.zscore(registry, job_id)
    return score is not None and score <= now
