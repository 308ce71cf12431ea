"""Operator actions on one job: cancel."""

from __future__ import annotations

from redis import Redis
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from . import clock, keys, scripts
from .config import settings
from .errors import NoSuchJob
from .lease import error_entry


def cancel(connection: Redis, job_id: str, now: float | None = None) -> str:
    """Cancel a job. Queued: failed at once with "canceled". Running: the next heartbeat
    stops it (failed, "canceled"); if it does not heartbeat within ``LEASH_CANCEL_GRACE``
    seconds the reaper sends RQ's stop command. Terminal: nothing changes.
    Returns the state the job was in."""
    now = clock.wall() if now is None else now
    s = settings()
    attempts, kind = connection.hmget(keys.job(job_id), "attempts", "kind")
    kind = (kind or b"").decode()
    state = scripts.run(
        connection, "cancel_v1",
        keys=[keys.job(job_id), keys.CANCELS, keys.items(job_id), keys.errors(job_id)]
        + keys.outcome_keys("failed", kind, now) + [keys.FAILED_INDEX, keys.payload(job_id)],
        args=[job_id, now, now + s.cancel_grace, s.result_ttl,
              error_entry(int(attempts or 0), "canceled", now), f"failed:{kind}", keys.STATS_MINUTE_TTL],
    )
    state = state.decode() if isinstance(state, bytes) else state
    if state == "missing":
        raise NoSuchJob(f"no such job: {job_id}")
    if state == "queued":
        try:
            # RQ removes it from its queue or rate-limit wait set and frees its slot.
            Job.fetch(job_id, connection=connection, serializer=JSONSerializer).cancel()
        except (NoSuchJobError, InvalidJobOperation):
            pass
    return state
