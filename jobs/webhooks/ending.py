"""Where the lifecycle core notes that a job may have ended (jobs/core/retention.py), for the
webhook sweep (jobs/webhooks/outbox.py), and the id a webhook of one ending has (the sweep gives
it; a status read from the archive finds its attempts by it). Imports nothing but the key names:
the core stays below every layer, and the note is one command on the caller's pipeline."""

from __future__ import annotations

import time

from redis import Redis

from jobs import keys


def note(connection: Redis, job_id: str, pipeline=None) -> None:
    """The job may have ended (or gone back to its queue): the sweep looks at it. Noted again, its
    score moves on, so a sweep that read it before keeps it for the next."""
    (pipeline or connection).zadd(keys.WEBHOOKS_DUE, {job_id: time.time()})


def delivery_id(job_id: str, ended_at: str) -> str:
    """The webhook's id for one ending of a job: the same on every attempt, another after a replay."""
    return f"msg_{job_id}_{round(float(ended_at) * 1000)}"
