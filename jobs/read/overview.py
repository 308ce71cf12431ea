"""What the overview page draws: how deep the queues are now, the workers (busy or idle, since
when, on which job), the owner's running jobs and how many items a minute they get through, and
the owner's jobs and failures per hour over the last day. Read from the queues and the owner's index (the same
pass as the jobs list), never from a scan of Redis.

Per hour, a job counts where it was submitted; a failure (not a cancel) where it ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis
from rq.serializers import JSONSerializer
from rq.worker import Worker

from jobs import keys
from jobs.config import settings
from jobs.core import clock
from jobs.core.text import decoded
from jobs.read import listing

HOURS = 24


@dataclass
class QueueDepth:
    queue: str
    waiting: int  #: in RQ's queue, for a worker
    retrying: int  #: scheduled by RQ's Retry, waiting for its time
    #: batch jobs waiting at their provider: RQ holds their next look as scheduled, but they
    #: are not retrying (no attempt failed) and hold no worker
    at_provider: int = 0


@dataclass
class Hourly:
    starts: list[float]  #: the start of each hour (unix seconds), oldest first
    submitted: list[int]
    failed: list[int]
    #: jobs that succeeded with item errors, by the hour they ended
    item_errors: list[int]


def queue_depths(connection: Redis) -> list[QueueDepth]:
    names = settings().queues
    looks = [member.decode() for member in connection.zrange(keys.BATCH_LOOKS, 0, -1)]
    with connection.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.llen(keys.rq_queue(name))
            pipe.zcard(keys.rq_scheduled(name, connection))
            if looks:
                pipe.zmscore(keys.rq_scheduled(name, connection), looks)
            else:
                pipe.echo("")
        replies = pipe.execute()
    depths = []
    for n, name in enumerate(names):
        waiting, scheduled, scores = replies[3 * n:3 * n + 3]
        at_provider = sum(score is not None for score in scores) if looks else 0
        depths.append(QueueDepth(name, waiting, scheduled - at_provider, at_provider))
    return depths


def hourly(connection: Redis, owner: str, now: float | None = None, hours: int = HOURS) -> Hourly:
    now = clock.wall() if now is None else now
    first = (now // 3600 - (hours - 1)) * 3600
    submitted, failed, item_errors = [0] * hours, [0] * hours, [0] * hours
    for row in listing.scan(connection, owner, listing.Filters(), now):
        if row.created is not None and first <= row.created < first + hours * 3600:
            submitted[int((row.created - first) // 3600)] += 1
        if row.ended is not None and first <= row.ended < first + hours * 3600:
            if row.view == listing.WITH_ITEM_ERRORS:
                item_errors[int((row.ended - first) // 3600)] += 1
            elif row.view == "failed":
                failed[int((row.ended - first) // 3600)] += 1
    return Hourly([first + 3600 * n for n in range(hours)], submitted, failed, item_errors)


@dataclass
class WorkerNow:
    name: str
    busy: bool
    since: str | None  #: busy: when its job's attempt started; idle: when the worker started (ISO)
    job_id: str | None  #: its job, when it is the owner's (another owner's job is not named)
    job_name: str | None
    others: bool  #: busy with another owner's job


#: Workers the overview lists at most.
MAX_WORKERS = 50


def workers(connection: Redis, owner: str) -> list[WorkerNow]:
    """The registered workers, busy ones first. Read through RQ's own registry of workers."""
    found = []
    for worker in Worker.all(connection=connection, serializer=JSONSerializer)[:MAX_WORKERS]:
        job_id = worker.get_current_job_id()
        busy = worker.get_state() == "busy" or job_id is not None
        since = clock.iso(worker.birth_date.timestamp()) if worker.birth_date else None
        mine = job_name = None
        others = False
        if job_id:
            job_owner, started, name = connection.hmget(keys.job(job_id), "owner", "started_at", "name")
            since = clock.iso(float(started)) if started else since
            if decoded(job_owner) == owner:
                mine, job_name = job_id, decoded(name)
            else:
                others = True
        found.append(WorkerNow(worker.name, busy, since, mine, job_name, others))
    return sorted(found, key=lambda w: (not w.busy, w.name))


@dataclass
class Running:
    jobs: list[dict]  #: the owner's running jobs' status fields, newest first (at most ``limit``)
    total: int
    items_per_minute: float  #: the sum of their current speeds
    #: of ``total``, the batch jobs waiting at their provider (running, but holding no worker)
    at_provider: int = 0


def running(connection: Redis, owner: str, limit: int = 10) -> Running:
    found = listing.find(connection, owner, 0, limit, listing.Filters(view="running"))
    rate = sum(job.get("items_per_second") or 0 for job in found.jobs)
    looks = [member.decode() for member in connection.zrange(keys.BATCH_LOOKS, 0, -1)]
    scores = connection.zmscore(keys.owner_state(owner, "running"), looks) if looks else []
    return Running(found.jobs, found.total, round(rate * 60, 1), sum(score is not None for score in scores))
