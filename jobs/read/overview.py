"""What the overview page draws: how deep the queues are now, and an owner's jobs and
failures per hour over the last day. Read from the queues and the owner's index (the same
pass as the jobs list), never from a scan of Redis.

Per hour, a job counts where it was submitted; a failure (not a cancel) where it ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis

from jobs import keys
from jobs.config import settings
from jobs.core import clock
from jobs.read import listing

HOURS = 24


@dataclass
class QueueDepth:
    queue: str
    waiting: int  #: in RQ's queue, for a worker
    retrying: int  #: scheduled by RQ's Retry, waiting for its time


@dataclass
class Hourly:
    starts: list[float]  #: the start of each hour (unix seconds), oldest first
    submitted: list[int]
    failed: list[int]


def queue_depths(connection: Redis) -> list[QueueDepth]:
    names = settings().queues
    with connection.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.llen(keys.rq_queue(name))
            pipe.zcard(keys.rq_scheduled(name, connection))
        replies = pipe.execute()
    return [QueueDepth(name, replies[2 * n], replies[2 * n + 1]) for n, name in enumerate(names)]


def hourly(connection: Redis, owner: str, now: float | None = None, hours: int = HOURS) -> Hourly:
    now = clock.wall() if now is None else now
    first = (now // 3600 - (hours - 1)) * 3600
    submitted, failed = [0] * hours, [0] * hours
    for row in listing.scan(connection, owner, listing.Filters(), now):
        if row.created is not None and first <= row.created < first + hours * 3600:
            submitted[int((row.created - first) // 3600)] += 1
        if row.view == "failed" and row.ended is not None and first <= row.ended < first + hours * 3600:
            failed[int((row.ended - first) // 3600)] += 1
    return Hourly([first + 3600 * n for n in range(hours)], submitted, failed)
