"""A pipeline's webhook (``webhook_url`` beside its stages): one POST when the pipeline has ended
-- every stage has ended (succeeded, failed or canceled) -- signed and retried exactly as a job's
completion webhook (jobs/webhooks/delivery.py).

The sweep of ended jobs (outbox.sweep) calls ``stage_ended`` for every ended job that is a stage of
a pipeline; the first call that finds every stage ended queues the delivery (an RQ job on the
default queue, whose dotted path ``DELIVER`` RQ stores: it never moves), once per ending of the
pipeline (a marker naming the ending and the job in one transaction). The delivery
(jobs/webhooks/pipeline_delivery.py) builds the body on its first attempt -- ``{"type":
"pipeline.succeeded" | "pipeline.failed" | "pipeline.canceled", "timestamp", "data": <GET
/pipelines/<id>>}`` -- keeps it for the next, and records each attempt in the pipeline's record
(``webhook`` in its status). This module reads only the stages' leash states, so the sweep stays
a short import away from the worker.
"""

from __future__ import annotations

import json
import logging

from redis import Redis
from redis.exceptions import WatchError
from rq import Retry

from jobs import keys
from jobs.config import settings
from jobs.config.webhook_settings import webhooks
from jobs.core import rq_side
from jobs.core.text import decoded
from jobs.webhooks.delivery import TIMEOUT

log = logging.getLogger("leash.webhooks")

DELIVER = "jobs.webhooks.pipeline_delivery.deliver"


def keep(connection: Redis, pipeline_id: str) -> None:
    """Give the pipeline's record, and its owner's list, LEASH_RESULT_TTL again: called as each of
    its stages starts and ends, so a pipeline outlives its last stage's end by that long, however
    long its stages ran or waited (its budget and webhook are read from the record)."""
    owner = connection.hget(keys.pipeline(pipeline_id), "owner")
    if owner is None:
        return
    ttl = settings().result_ttl
    with connection.pipeline(transaction=False) as pipe:
        pipe.expire(keys.pipeline(pipeline_id), ttl)
        pipe.expire(keys.owner_pipelines(decoded(owner)), ttl)
        pipe.execute()


def stage_ended(connection: Redis, pipeline_id: str) -> int:
    """Queue the pipeline's webhook if it has one and has ended -- once per ending: a pipeline that
    ends again (a stage replayed, as a job's webhook is sent again when a replayed job ends) is
    told again, so the receiver last hears what its status says; 1 when queued here, else 0."""
    keep(connection, pipeline_id)  # a stage ended: the pipeline lives on from now
    url, stages = (decoded(v) for v in connection.hmget(keys.pipeline(pipeline_id), "webhook_url", "stages"))
    if not url or not stages:
        return 0
    job_ids = [stage["job_id"] for stage in json.loads(stages)]
    if not all(job_ids):
        return 0  # still being written
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), "state", "ended_at")
        ends = [(decoded(state), decoded(ended_at)) for state, ended_at in pipe.execute()]
    if not all(state in ("succeeded", "failed", None) for state, _ in ends):
        return 0
    ending = " ".join(ended_at or "-" for _, ended_at in ends)  # this ending of every stage
    hook = webhooks()
    retry = Retry(max=hook.attempts - 1, interval=rq_side.retry_intervals(hook.attempts, hook.webhook_backoff)) \
        if hook.attempts > 1 else None
    queue = rq_side.rq_queue(connection, None)
    marker = keys.pipeline_webhook(pipeline_id)
    with connection.pipeline() as pipe:
        try:
            pipe.watch(marker)
            if decoded(pipe.get(marker)) == ending:
                return 0  # this ending was told
            told = int(pipe.hget(keys.pipeline(pipeline_id), "webhook_endings") or 0)
            suffix = f"_{told + 1}" if told else ""  # the first keeps the plain id
            delivery_id = f"msg_{pipeline_id}{suffix}"
            pipe.multi()
            pipe.set(marker, ending, ex=settings().result_ttl)
            pipe.hset(keys.pipeline(pipeline_id), mapping={"webhook_state": "pending", "webhook_attempts": 0,
                                                           "webhook_status": "", "webhook_error": "",
                                                           "webhook_endings": told + 1})
            queue.enqueue_call(DELIVER, args=(pipeline_id, delivery_id, url),
                               job_id=f"webhook_{pipeline_id}{suffix}", timeout=int(TIMEOUT) + 30, retry=retry,
                               result_ttl=settings().result_ttl, failure_ttl=settings().result_ttl,
                               description=f"webhook of pipeline {pipeline_id}", pipeline=pipe)
            pipe.execute()
        except WatchError:
            return 0  # another sweep queued it
    log.info("webhook %s of pipeline %s queued for %s", delivery_id, pipeline_id, url)
    return 1
