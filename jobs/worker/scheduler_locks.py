"""Freeing the retry scheduler's lock when the scheduler holding it is dead.

RQ's scheduler (it moves retries whose backoff has passed back to their queue) holds a
lock per queue with a TTL of its interval + 60 s and renews it every interval. When the
worker running it is SIGKILLed, nobody else may schedule retries for that queue until the
lock expires: about a minute of retries waiting past their backoff. A lock not renewed for
``STALE_AFTER`` seconds (read from its remaining TTL) belongs to a dead scheduler, so it is
released (compare-and-delete, in case it changed hands) and a live worker's scheduler takes
over. A scheduler that is merely slow loses nothing: RQ's refresh script sees the new holder
and that scheduler stops moving jobs for the queue.
"""

from __future__ import annotations

from redis import Redis

from jobs import keys
from jobs.lifecycle import scripts

STALE_AFTER = 10


def release_if_holder_dead(connection: Redis, queue_names: list[str], full_ttl: int) -> list[str]:
    """Release the scheduler locks of ``queue_names`` not renewed for STALE_AFTER seconds
    (``full_ttl``: the TTL each renewal sets, RQ's interval + 60). Returns those queues."""
    released = []
    for queue_name in queue_names:
        lock = keys.rq_scheduler_lock(queue_name)
        with connection.pipeline(transaction=False) as pipe:
            pipe.get(lock)
            pipe.ttl(lock)
            holder, ttl = pipe.execute()
        if holder is None or ttl < 0 or full_ttl - ttl < STALE_AFTER:
            continue
        if scripts.run(connection, "release_stale_lock_v1", keys={"lock": lock}, args=[holder]):
            released.append(queue_name)
    return released
