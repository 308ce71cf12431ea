"""A batch job waiting at its provider is never lost by RQ's side.

A parked batch job (park_v1) comes back for its next look only through RQ: its RQ job waits in
the ScheduledJobRegistry until the look is due, and RQ's scheduler queues it. If that entry or
RQ's job hash is deleted (rq-dashboard's Delete, ``rq empty``, an operator cleaning registries,
a failover that lost the last writes), nothing would look at the job again: it would stay
running (stale) for ever, and the batch the provider finishes would be paid for and never read.

park_v1 indexes every waiting job by when its next look is overdue by more than the look's
grace (``keys.BATCH_LOOKS``, scored by its ``lease_expires_at``: when the job starts to read
stale). Each consistency sweep reads the entries past that time -- one command when every look
comes on time -- and, for each overdue job, RQ's side in one transaction (atomic against RQ's
scheduler, which moves a due look to its queue in one too):

    queued (its queue or a worker's intermediate list), scheduled (in the registry), started,
    or waiting for a place among its owner's running jobs   -> late only: read again after
                                                                another grace
    none of those (the entry or RQ's job is gone)            -> the look is put back: RQ's job
                                                                rebuilt from leash's payload
                                                                copy if it is gone, scheduled
                                                                now; one WARNING per job

The index is a lower bound of when each job's look is overdue: a look under way, a look given
back (release_v3) or a job that ended keeps its entry until the sweep reads it; the entry then
moves to when the job's look is really overdue, or leaves.

A look put back while a late one reaches a worker after all (RQ's job rebuilt while its id
still sat in the queue) makes two looks at worst, never two at once: claim_v4 hands a look only
to a job that is waiting, so the second is refused while the first runs (and dropped), or comes
after it (the job is waiting again: one more look; or ended: dropped); each look's writes are
fenced by its own token, and no look counts an attempt.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from redis import Redis
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.config import settings
from jobs.core import clock
from jobs.core.rq_side import rq_jobs_from_copy, rq_queue
from jobs.core.text import decoded

log = logging.getLogger("leash.consistency")

#: Overdue looks read per sweep (more wait for the next one).
BATCH = 200
#: The shortest grace a look has (``lease.look_grace``): how soon an entry is read again when
#: its job says nothing better.
MIN_GRACE = 30.0


def put_back_lost(connection: Redis, now: float | None = None) -> list[str]:
    """Put back the looks RQ lost of batch jobs waiting at their provider (see the module).
    Returns the ids of the jobs whose look was put back."""
    now = clock.wall() if now is None else now
    due = connection.zrangebyscore(keys.BATCH_LOOKS, "-inf", now, start=0, num=BATCH)
    if not due:
        return []
    job_ids = [decoded(j) for j in due]
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), "state", "phase", "look_at", "lease_expires_at", "queue", "owner")
        rows = pipe.execute()
    gone: list[str] = []
    rescored: dict[str, float] = {}
    overdue: list[tuple[str, str, str, float]] = []
    for job_id, row in zip(job_ids, rows, strict=True):
        state, phase, look_at, expires, queue, owner = (decoded(v) for v in row)
        look, stale_at = float(look_at or now), float(expires or now)
        if state != "running":
            gone.append(job_id)  # ended, reclaimed or expired: RQ's side is not this module's concern
        elif phase != "waiting" or stale_at > now:
            # A look under way (its lease is the reaper's concern), or one given back or parked
            # since the entry was written: read again when that look would be overdue.
            rescored[job_id] = stale_at if stale_at > now else now + MIN_GRACE
        else:
            overdue.append((job_id, queue or settings().queue, owner or "", look))
            rescored[job_id] = now + max(stale_at - look, MIN_GRACE)  # if still not looked at, a grace later
    lost = _lost_on_rq_side(connection, overdue)
    put_back = _put_back(connection, lost, now)
    with connection.pipeline(transaction=False) as pipe:
        if gone:
            pipe.zrem(keys.BATCH_LOOKS, *gone)
        if rescored:
            pipe.zadd(keys.BATCH_LOOKS, rescored)
        pipe.execute()
    return put_back


Lost = tuple[str, str, bool, float]  #: (job id, queue, RQ's job exists, when the look was due)


def _lost_on_rq_side(connection: Redis, overdue: list[tuple[str, str, str, float]]) -> list[Lost]:
    """Of the overdue jobs, those RQ will never bring back. One transaction: RQ's scheduler
    moves a look from its registry to its queue in one as well, so a job is never seen in
    neither."""
    if not overdue:
        return []
    with connection.pipeline(transaction=True) as pipe:
        for job_id, queue, owner, _ in overdue:
            pipe.hget(keys.rq_job(job_id), "status")
            pipe.zscore(keys.rq_scheduled(queue, connection), job_id)
            pipe.lpos(keys.rq_queue(queue), job_id)
            pipe.lpos(keys.rq_intermediate(queue, connection), job_id)
            pipe.zscore(keys.rq_rate_limit(keys.owner_rate_limit_key(owner), connection).rate_limited_key, job_id)
        raw = pipe.execute()
    lost = []
    for n, (job_id, queue, _, look) in enumerate(overdue):
        status, scheduled, queued, taken, limited = raw[5 * n:5 * n + 5]
        exists = status is not None
        # Canceled or stopped with RQ's own tools: an operator's act this sweep does not undo.
        held = decoded(status) in ("started", "canceled", "stopped")
        if exists and (held or any(v is not None for v in (scheduled, queued, taken, limited))):
            continue
        lost.append((job_id, queue, exists, look))
    return lost


def _put_back(connection: Redis, lost: list[Lost], now: float) -> list[str]:
    """Schedule each lost look now (RQ's scheduler then queues it through the owner's limit,
    as it does every look), rebuilding RQ's job first where it is gone."""
    if not lost:
        return []
    rebuilt = rq_jobs_from_copy(connection, [job_id for job_id, _, exists, _ in lost if not exists])
    when = datetime.fromtimestamp(now, UTC)
    done = []
    with connection.pipeline() as pipe:
        for job_id, queue, _, look in lost:
            if job_id in rebuilt:
                q, job = rebuilt[job_id]
            else:
                try:
                    q, job = rq_queue(connection, queue), Job.fetch(job_id, connection=connection,
                                                                    serializer=JSONSerializer)
                except NoSuchJobError:
                    log.warning("job %s: its look at the provider's batch is %s late and RQ no longer has it; "
                                "it cannot be put back (leash's payload copy is gone): cancel it",
                                job_id, _late(now - look))
                    continue
            pipe.zrem(keys.rq_failed(queue, connection), job_id)  # RQ's cleanup may have failed it there
            q.schedule_job(job, when, pipeline=pipe)
            done.append((job_id, look, job_id in rebuilt))
        pipe.execute()
    for job_id, look, was_rebuilt in done:
        log.warning("job %s: its look at the provider's batch was due %s ago and RQ no longer had it "
                    "(%s); scheduled again%s", job_id, _late(now - look),
                    "its RQ job was deleted" if was_rebuilt else "its entry was removed from RQ's registries",
                    ", RQ's job rebuilt from leash's copy of the payload" if was_rebuilt else "")
    return [job_id for job_id, _, _ in done]


def _late(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
