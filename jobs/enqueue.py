"""Putting a job on the queue: validate first, write second.

A job is a kind, a JSON payload, an owner and ``max_attempts``. Its RQ job carries a
``RateLimit`` per owner (jobs beyond the owner's concurrency wait as ``rate_limited``, never
rejected) and a ``Retry`` whose intervals give the backoff between failed attempts. RQ
forbids ``unique`` with ``rate_limit``, so the idempotency key is leash's own key.
"""

from __future__ import annotations

import re
import secrets

from redis import Redis
from rq import Queue, Retry
from rq.rate_limit import RateLimit
from rq.serializers import JSONSerializer

from . import clock, keys, kinds
from .config import settings
from .errors import InvalidJob
from .limits import check_payload

EXECUTE = "jobs.runner.execute"
_SAFE = re.compile(r"^[A-Za-z0-9_.:@-]{1,200}$")


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


def _validate(kind: str, payload, owner: str, max_attempts: int, idempotency_key: str | None) -> int:
    if not isinstance(kind, str):
        raise InvalidJob("'kind' must be a string")
    definition = kinds.get(kind)
    check_payload(payload)  # an object, within LEASH_MAX_PAYLOAD_BYTES and _DEPTH
    if not isinstance(owner, str) or not _SAFE.match(owner):
        raise InvalidJob("owner must be 1-200 characters of letters, digits and _.:@-")
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or not 1 <= max_attempts <= 100:
        raise InvalidJob("max_attempts must be an integer from 1 to 100")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not _SAFE.match(idempotency_key)):
        raise InvalidJob("idempotency key must be 1-200 characters of letters, digits and _.:@-")
    return definition.validate(payload)


def enqueue(connection: Redis, kind: str, payload: dict, owner: str = "default",
            max_attempts: int | None = None, idempotency_key: str | None = None,
            queue: str | None = None, now: float | None = None) -> tuple[str, bool]:
    """Enqueue a job; returns ``(job_id, created)``. With an idempotency key already used by
    this owner, returns the first job's id and ``created=False`` and writes nothing."""
    s = settings()
    max_attempts = s.max_attempts if max_attempts is None else max_attempts
    total = _validate(kind, payload, owner, max_attempts, idempotency_key)
    job_id = new_job_id()
    idem_key = keys.idempotency(owner, idempotency_key) if idempotency_key else None
    if idem_key and not connection.set(idem_key, job_id, nx=True, ex=s.result_ttl):
        existing = connection.get(idem_key)
        if existing is not None:
            return existing.decode(), False
    now = clock.wall() if now is None else now
    q = rq_queue(connection, queue or s.queue)
    retry = Retry(max=max_attempts - 1, interval=s.retry_backoff) if max_attempts > 1 else None
    job = q.create_job(
        EXECUTE, args=(kind, payload), job_id=job_id, timeout=s.job_timeout,
        result_ttl=s.result_ttl, failure_ttl=s.result_ttl, retry=retry,
        rate_limit=RateLimit(f"leash-owner:{owner}", s.owner_concurrency),
        description=f"{kind} ({total} items) for {owner}",
        meta={"leash_kind": kind, "leash_owner": owner},
    )
    try:
        # leash's record and RQ's job in ONE transaction: no crash can leave either alone.
        with connection.pipeline() as pipe:
            # Counters (attempts, token, done, handoffs, defers) start absent, meaning 0.
            pipe.hset(keys.job(job_id), mapping={
                "kind": kind, "owner": owner, "queue": q.name, "state": "queued",
                "max_attempts": max_attempts, "total": total, "created_at": now, "updated_at": now,
            })
            pipe.zadd(keys.owner_jobs(owner), {job_id: now})
            pipe.sadd(q.redis_queues_keys, q.key)  # as RQ's enqueue_job does: `rq info`, dashboards
            # RQ's own rate-limited enqueue (save, wait set, promotion script) on our pipeline;
            # its public enqueue_job refuses a pipeline for rate-limited jobs (rq pinned 3.0.0).
            q._enqueue_rate_limited_job(job, pipeline=pipe)
            pipe.execute()
    except BaseException:
        if idem_key:
            connection.delete(idem_key)
        raise
    return job_id, True
