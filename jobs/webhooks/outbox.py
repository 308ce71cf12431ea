"""The sweep of ended jobs, run by every worker beside its reaper (one worker at a time, by a
shared throttle): for each job noted as possibly ended (``ending.note``, from
jobs/core/retention.py) that has ended, start its webhook if it has one, once per ending, and move
on the jobs waiting for it that RQ does not release itself (``jobs.core.parents.release``).

Starting is one transaction, watched on the job's record: the ending begun in the record (a
delivery id, ``webhook_v1`` 'begin') and the delivery's RQ job put on the job's own queue (with
RQ's ``Retry``, one retry per LEASH_WEBHOOK_BACKOFF interval). Either both happen or neither, so
a process that dies in between loses nothing and a second sweep starts nothing twice. A noted
job still queued or running (a retry) is dropped from the notes: its next ending notes it again."""

from __future__ import annotations

import json
import logging
import time

from redis import Redis
from redis.exceptions import WatchError
from rq import Retry

from jobs import keys
from jobs.config import settings
from jobs.config.webhook_settings import webhooks
from jobs.core import control, parents, rq_side, states
from jobs.core.text import decoded
from jobs.lifecycle import transitions
from jobs.webhooks import pipeline_hooks
from jobs.webhooks.delivery import TIMEOUT
from jobs.webhooks.ending import delivery_id

log = logging.getLogger("leash.webhooks")

#: Notes one sweep reads at most; this process's sweeps are INTERVAL seconds apart at least.
BATCH = 100
INTERVAL = 0.5
#: Where RQ finds the delivery (stored in each delivery's RQ job: it never moves).
DELIVER = "jobs.webhooks.delivery.deliver"
#: A delivery's RQ job may run this long past its HTTP timeout (the address check, the record).
TIMEOUT_MARGIN = 30
#: Fields of the status the body leaves out: the webhook's own bookkeeping.
NOT_IN_BODY = ("webhook",)

_next_at = 0.0


def tick(connection: Redis) -> int:
    """What a worker calls on every reaper tick. Returns how many webhooks it started."""
    global _next_at
    if time.monotonic() < _next_at:
        return 0
    _next_at = time.monotonic() + INTERVAL
    if not connection.set(keys.WEBHOOKS_THROTTLE, "1", nx=True, px=30_000):
        return 0
    try:
        return sweep(connection)
    finally:
        connection.delete(keys.WEBHOOKS_THROTTLE)


def sweep(connection: Redis, limit: int = BATCH) -> int:
    """Start the webhooks of the noted jobs that ended; let go of the notes read."""
    noted = connection.zrange(keys.WEBHOOKS_DUE, 0, limit - 1, withscores=True)
    if not noted:
        return 0
    ids = [decoded(job_id) for job_id, _ in noted]
    with connection.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hmget(keys.job(job_id), "state", "ended_at", "webhook_url", "webhook_ending", "queue", "pipeline")
        records = pipe.execute()
    started = 0
    for job_id, record in zip(ids, records, strict=True):
        state, ended_at, url, begun, queue, pipeline_id = (decoded(v) for v in record)
        if state in ("succeeded", "failed") and ended_at and url and begun != ended_at:
            started += start(connection, job_id, ended_at, url, queue)
        if state in ("succeeded", "failed"):
            parents.release(connection, job_id, state, control.cancel)
            if pipeline_id:  # the pipeline's own webhook, once it has ended (jobs/webhooks/pipeline_hooks.py)
                started += pipeline_hooks.stage_ended(connection, pipeline_id)
    _forget(connection, noted)
    return started


def _forget(connection: Redis, noted: list) -> None:
    """Drop the notes read, but one noted again meanwhile (a newer score): its job may have ended
    since it was read, and the next sweep looks at it."""
    with connection.pipeline() as pipe:
        try:
            pipe.watch(keys.WEBHOOKS_DUE)
            scores = pipe.zmscore(keys.WEBHOOKS_DUE, [job_id for job_id, _ in noted])
            read = [job_id for (job_id, score), now in zip(noted, scores, strict=True) if now == score]
            pipe.multi()
            if read:
                pipe.zrem(keys.WEBHOOKS_DUE, *read)
            pipe.execute()
        except WatchError:
            pass  # noted meanwhile: the next sweep reads them again (starting is once per ending)


def start(connection: Redis, job_id: str, ended_at: str, url: str, queue: str | None) -> int:
    """Begin the webhook of this ending and enqueue its delivery, in one transaction; 0 when
    it was begun already or the job changed meanwhile."""
    hook = webhooks()
    msg_id = delivery_id(job_id, ended_at)
    body = event(connection, job_id)
    attempts = hook.attempts
    retry = Retry(max=attempts - 1, interval=rq_side.retry_intervals(attempts, hook.webhook_backoff)) \
        if attempts > 1 else None
    q = rq_side.rq_queue(connection, queue or None)
    with connection.pipeline() as pipe:
        try:
            pipe.watch(keys.job(job_id))
            now_ended, begun = (decoded(v) for v in pipe.hmget(keys.job(job_id), "ended_at", "webhook_ending"))
            if now_ended != ended_at or begun == ended_at:
                return 0
            pipe.multi()
            transitions.webhook(connection, job_id, ["begin", ended_at, msg_id], pipeline=pipe)
            q.enqueue_call(DELIVER, args=(job_id, msg_id, url, body), job_id=msg_id.replace("msg_", "webhook_", 1),
                           timeout=int(TIMEOUT) + TIMEOUT_MARGIN, retry=retry,
                           result_ttl=settings().result_ttl, failure_ttl=settings().result_ttl,
                           description=f"webhook of job {job_id}", pipeline=pipe)
            pipe.execute()
        except WatchError:
            return 0  # the record changed: the next sweep reads it again
    log.info("webhook %s of job %s queued for %s", msg_id, job_id, url)
    return 1


def event(connection: Redis, job_id: str) -> str:
    """The body: the event's type, when the job ended, and its status as GET /jobs/<id> gives it."""
    status = {k: v for k, v in states.status(connection, job_id).items() if k not in NOT_IN_BODY}
    outcome = "canceled" if status.get("canceled") else status["state"]
    return json.dumps({"type": f"job.{outcome}", "timestamp": status.get("finished_at") or status["updated_at"],
                       "data": status}, separators=(",", ":"))
