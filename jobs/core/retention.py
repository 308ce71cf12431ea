"""Retention: one rule for every key a job owns, leash's and RQ's.

However a job ends — succeeded, failed, canceled while queued, running or waiting for a retry,
deleted or canceled with RQ's tools, or with RQ's own bookkeeping refused by a full Redis — its
record (``keys.job``) gets an expiry of LEASH_RESULT_TTL, and then:

    every other key of the job          expires no later than the record (``retain``, retain_v1.lua):
    (``keys.retained_with_job``)        RQ's record, which holds the submitted items, included
    its entry in RQ's canceled registry leaves a retention after the cancel (``trim_canceled``:
                                        RQ never lets those go by itself)

``retain`` runs where a job ends: the cancel (``jobs.core.control``), the sweep's end of a job
RQ's tools ended (``jobs.core.upkeep.consistency``), the worker once an attempt is over and when it drops
a queue entry of an ended job; and once more when the sweep sees the job ended, for what a
process that died in between (or a release before this rule) left behind.
"""

from __future__ import annotations

from redis import Redis

from jobs import keys
from jobs.archive import pending
from jobs.config import settings, stores
from jobs.lifecycle import transitions
from jobs.webhooks import ending


def retain(connection: Redis, job_id: str, pipeline=None) -> int | None:
    """Give every key of an ended job at most its record's remaining time. Returns how many
    keys changed (None when queued on ``pipeline``); nothing changes before the job ended."""
    pending.note_ended(connection, job_id, stores.archive().url, pipeline=pipeline)  # to the archive once ended
    ending.note(connection, job_id, pipeline=pipeline)  # its completion webhook, if it has one
    return transitions.retain(connection, job_id, [settings().result_ttl], pipeline=pipeline)


def retain_many(connection: Redis, job_ids: list[str]) -> int:
    """``retain`` for many jobs in one round trip."""
    if not job_ids:
        return 0
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            retain(connection, job_id, pipeline=pipe)
        return sum(int(n or 0) for n in pipe.execute())


def trim_canceled(connection: Redis, now: float) -> int:
    """Let go of the entries of RQ's canceled registries older than the retention. RQ scores
    them by when the job was canceled and never removes them; their records expire a
    retention after the cancel, and so do they. A record a release before this rule left
    without an expiry (still canceled: a replayed job's record is left alone) goes with its
    entry. Returns how many entries left."""
    queue_keys = connection.smembers(keys.rq_queues_set())
    if not queue_keys:
        return 0
    prefix = len(keys.rq_queue(""))
    before = f"({now - settings().result_ttl}"
    registries = [keys.rq_canceled(_text(k)[prefix:], connection) for k in queue_keys]
    with connection.pipeline(transaction=False) as pipe:
        for registry in registries:
            pipe.zrangebyscore(registry, "-inf", before)
        due = [_text(job_id) for found in pipe.execute() for job_id in found]
    if due:
        with connection.pipeline(transaction=False) as pipe:
            for job_id in due:
                pipe.hget(keys.rq_job(job_id), "status")
                pipe.ttl(keys.rq_job(job_id))
            seen = pipe.execute()
        with connection.pipeline(transaction=False) as pipe:
            for n, job_id in enumerate(due):
                if seen[2 * n] == b"canceled" and seen[2 * n + 1] == -1:
                    pipe.expire(keys.rq_job(job_id), 1)
            if pipe.command_stack:
                pipe.execute()
    with connection.pipeline(transaction=False) as pipe:
        for registry in registries:
            pipe.zremrangebyscore(registry, "-inf", before)
        return sum(pipe.execute())


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
