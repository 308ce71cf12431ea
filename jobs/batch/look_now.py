""""Look now" on a batch job waiting at its provider: its look, parked in RQ's scheduled
registry until it is due, is made due now; RQ's scheduler queues it within a second or so, and
the look runs as every look does (claimed like any look, fenced, counted nowhere as an attempt).
Only ever earlier (ZADD XX LT): a look already due or under way is left as it is. At most one
per job every LOOK_EVERY (each look is a call to the provider): the next is a 429 saying when."""

from __future__ import annotations

from redis import Redis

from jobs import keys
from jobs.core import clock
from jobs.core.text import decoded
from jobs.intake import admission

#: "Look now" at most this often per job (a ``limits`` rate, counted in the job store's Redis).
LOOK_EVERY = "1/30 seconds"


def too_soon(connection: Redis, job_id: str) -> int:
    """Seconds until this job's "Look now" may be pressed again (0: now, and it is counted)."""
    wait, _ = admission.hit(connection, LOOK_EVERY, [keys.rate_scope("look", job_id)])
    return wait


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
