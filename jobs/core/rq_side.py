"""A leash job on RQ's side: the function RQ runs, the RQ job and queue that carry it, its
retries, and what RQ's own statuses mean for a leash job (read by a status, recorded by the
consistency sweep).
"""

from __future__ import annotations

import json
import secrets
import zlib

from redis import Redis
from rq import Queue, Retry
from rq.job import Job
from rq.rate_limit import RateLimit
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.config import Settings, settings
from jobs.core import payload_copy

#: What RQ runs for every leash job. Stored in each queued job: it never moves.
EXECUTE = "jobs.runner.execute"



def finished_data(kind: str) -> bytes:
    """RQ's ``data`` for a succeeded leash job (compact_finished_rq_job_v1.lua): RQ's own
    (function, instance, args, kwargs) shape, JSON as RQ's JSONSerializer reads it, with the
    kind and an empty payload. ``Job.fetch`` reads it (``args == [kind, {}]``), rq-dashboard
    shows it; the payload itself stays in leash's copy. Compressed like RQ's own only when that
    is smaller: RQ reads plain data too, and a 50-byte record does not shrink."""
    plain = json.dumps([EXECUTE, None, [kind, {}], {}], separators=(",", ":")).encode()
    packed = zlib.compress(plain)
    return packed if len(packed) < len(plain) else plain


REMOVED = "removed from the queue outside leash: deleted or emptied in RQ (rq-dashboard, `rq empty`)"
PLAIN_WORKER = "run by a plain RQ worker: start workers with `leash worker` (an `rq worker` holds no lease)"
ENDED_BY_RQ = {
    "canceled": "canceled in RQ (rq-dashboard or RQ's job.cancel())",
    "stopped": "stopped by RQ's stop command",
    "failed": "failed in RQ, outside `leash worker` (a plain `rq worker`?)",
}
#: RQ statuses of a job RQ's tools put back to run (a requeue of a failed leash job).
REQUEUED_STATUSES = frozenset({"queued", "rate_limited"})
#: A job canceled by leash is failed in leash a moment before RQ's cancel removes it from the
#: queue; a requeue is only believed once the job has been failed for longer than this.
SETTLE_SECONDS = 5.0


def requeued_by_rq(leash_state: str | None, rq_status: str | None, ended_at: float | None, now: float) -> bool:
    """leash says failed but RQ put the job back to run: RQ's tools requeued it."""
    return (leash_state == "failed" and rq_status in REQUEUED_STATUSES
            and ended_at is not None and now - ended_at > SETTLE_SECONDS)


def new_job_id() -> str:
    """144 random bits in RQ's id alphabet [A-Za-z0-9_-], never starting with "-" or "_"
    (a leading "-" would read as an option on the command line)."""
    while True:
        job_id = secrets.token_urlsafe(18)
        if job_id[0].isalnum():
            return job_id


_queues: dict[tuple[int, str], Queue] = {}


def rq_queue(connection: Redis, name: str | None = None) -> Queue:
    """RQ's Queue object, kept per connection: building one costs a Redis INFO round trip."""
    name = name or settings().queue
    queue = _queues.get((id(connection), name))
    if queue is None or queue.connection is not connection:
        queue = _queues[(id(connection), name)] = Queue(name, connection=connection, serializer=JSONSerializer)
    return queue


def retry_intervals(max_attempts: int, backoff: list[int]) -> list[int]:
    """RQ's ``Retry`` intervals meaning "backoff[0] before the second attempt, backoff[1] before
    the third, the last value after that". RQ 3.0 picks ``intervals[len - retries_left]``,
    counting from the end of the list, so the list must have exactly one value per retry."""
    backoff = backoff or [0]
    return [backoff[min(n, len(backoff) - 1)] for n in range(max_attempts - 1)]


def rq_job_for(q: Queue, job_id: str, kind: str, payload: dict, owner: str, max_attempts: int, total: int,
               s: Settings | None = None, depends_on=None):
    """RQ's side of a leash job (also rebuilt by a replay when RQ's record was deleted);
    ``depends_on``: the jobs it waits for (jobs.core.parents)."""
    s = s or settings()
    retry = Retry(max=max_attempts - 1, interval=retry_intervals(max_attempts, s.retry_backoff)) \
        if max_attempts > 1 else None
    return q.create_job(
        EXECUTE, args=(kind, payload), job_id=job_id, timeout=s.job_timeout,
        result_ttl=s.result_ttl, failure_ttl=s.result_ttl, retry=retry,
        rate_limit=RateLimit(keys.owner_rate_limit_key(owner), s.owner_concurrency),
        description=f"{kind} ({total} items) for {owner}",
        meta={"leash_kind": kind, "leash_owner": owner}, depends_on=depends_on,
    )


def rq_jobs_from_copy(connection: Redis, job_ids: list[str]) -> dict[str, tuple[Queue, Job]]:
    """RQ's side of leash jobs whose RQ job was deleted behind leash's back, rebuilt (not yet
    saved) from leash's own copy of the payload: a replay saves them failed and replays them,
    the sweep schedules a waiting batch job's lost look (``jobs.core.upkeep.lost_looks``). A job
    without a record or a payload copy is left out."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), "kind", "owner", "max_attempts", "total", "queue")
            pipe.get(keys.payload(job_id))
        rows = pipe.execute()
    built = {}
    for n, job_id in enumerate(job_ids):
        (kind, owner, max_attempts, total, queue), payload = [_text(v) for v in rows[2 * n]], rows[2 * n + 1]
        if kind is None or payload is None:
            continue
        q = rq_queue(connection, queue or settings().queue)
        job = rq_job_for(q, job_id, kind, payload_copy.decode(payload), owner or "default", int(max_attempts or 1),
                         int(total or 0))
        job.origin = q.name
        built[job_id] = (q, job)
    return built


def _text(value: bytes | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
