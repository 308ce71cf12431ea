"""Failed jobs written straight into Redis, exactly as the worker leaves them, for tests and
benchmarks of the dead-letter path (running 100,000 jobs to failure would take hours).

Each job gets what a real failure leaves: the leash job hash (state failed, attempts used up,
the error text), its checkpointed items, its error history, an entry in the failed index, and
RQ's side — a job hash with status failed, ``failure_ttl`` expiry and an entry in RQ's
FailedJobRegistry. Writes are pipelined in batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from redis import Redis
from rq import Retry
from rq.job import JobStatus
from rq.rate_limit import RateLimit

from jobs import keys
from jobs.config import settings
from jobs.core import clock, payload_copy
from jobs.core.lease import error_entry
from jobs.core.rq_side import EXECUTE, new_job_id, retry_intervals, rq_queue


@dataclass
class FailedJob:
    kind: str
    error: str
    failed_at: float | None = None
    payload: dict = field(default_factory=lambda: {"items": ["a"]})
    owner: str = "default"
    max_attempts: int = 3
    #: item index -> result already checkpointed before the failure
    done_items: dict[int, object] = field(default_factory=dict)
    job_id: str | None = None
    #: RQ-side per-owner RateLimit, as ``enqueue`` sets it; False for a plain RQ job
    rate_limited: bool = True


def traceback_text(summary: str, frames: int = 6) -> str:
    """A stored error as ``lease.describe`` writes it: the summary line, then a traceback."""
    lines = [summary, "Traceback (most recent call last):"]
    for n in range(frames):
        lines.append(f'  File "/app/jobs/kinds_impl.py", line {100 + 17 * n}, in step_{n}')
        lines.append(f"    result = call_model(batch[{n}], timeout=timeout)")
    lines.append(summary)
    return "\n".join(lines)


def write_failed_jobs(connection: Redis, jobs: Iterable[FailedJob], now: float | None = None,
                      batch: int = 500) -> list[str]:
    """Write failed jobs; returns their ids in order."""
    now = clock.wall() if now is None else now
    s = settings()
    queue = rq_queue(connection)
    failed_registry = keys.rq_failed(queue.name, connection)
    ids: list[str] = []
    pipe = connection.pipeline(transaction=False)
    pending = 0
    for spec in jobs:
        job_id = spec.job_id or new_job_id()
        ids.append(job_id)
        _write_one(pipe, queue, failed_registry, spec, job_id, now, s)
        pending += 1
        if pending >= batch:
            pipe.execute()
            pending = 0
    if pending:
        pipe.execute()
    return ids


def _write_one(pipe, queue, failed_registry: str, spec: FailedJob, job_id: str, now: float, s) -> None:
    failed_at = now if spec.failed_at is None else spec.failed_at
    created_at = failed_at - 60
    total = len(spec.payload.get("items", []))
    pipe.hset(keys.job(job_id), mapping={
        "kind": spec.kind, "owner": spec.owner, "queue": queue.name, "state": "failed",
        "attempts": spec.max_attempts, "max_attempts": spec.max_attempts, "token": spec.max_attempts,
        "done": len(spec.done_items), "total": total, "created_at": created_at,
        "updated_at": failed_at, "ended_at": failed_at, "started_at": failed_at - 5,
        "error": spec.error, "lease_expires_at": "", "cancel_requested": 0, "handoffs": 0,
    })
    if spec.done_items:
        pipe.hset(keys.items(job_id), mapping={str(i): json.dumps(v) for i, v in spec.done_items.items()})
        pipe.expire(keys.items(job_id), s.result_ttl)
    for attempt in range(1, spec.max_attempts + 1):
        pipe.rpush(keys.errors(job_id), error_entry(attempt, spec.error, failed_at - (spec.max_attempts - attempt)))
    pipe.set(keys.payload(job_id), payload_copy.encode(spec.payload), ex=s.result_ttl)
    pipe.expire(keys.job(job_id), s.result_ttl)
    pipe.expire(keys.errors(job_id), s.result_ttl)
    pipe.zadd(keys.FAILED_INDEX, {job_id: failed_at})
    pipe.zadd(keys.owner_jobs(spec.owner), {job_id: created_at})
    # As fail_v2 indexes a failed job: by creation in its owner's failed index, due to leave with it.
    pipe.zadd(keys.owner_state(spec.owner, "failed"), {job_id: created_at})
    pipe.zadd(keys.owner_expiries(spec.owner), {job_id: now + s.result_ttl})
    pipe.expire(keys.owner_state(spec.owner, "failed"), s.result_ttl)
    pipe.expire(keys.owner_expiries(spec.owner), s.result_ttl)

    retry = Retry(max=spec.max_attempts - 1, interval=retry_intervals(spec.max_attempts, s.retry_backoff)) \
        if spec.max_attempts > 1 else None
    job = queue.create_job(
        EXECUTE, args=(spec.kind, spec.payload), job_id=job_id, timeout=s.job_timeout,
        result_ttl=s.result_ttl, failure_ttl=s.result_ttl, retry=retry,
        rate_limit=RateLimit(keys.owner_rate_limit_key(spec.owner), s.owner_concurrency) if spec.rate_limited else None,
        description=f"{spec.kind} ({total} items) for {spec.owner}",
        meta={"leash_kind": spec.kind, "leash_owner": spec.owner}, status=JobStatus.FAILED,
    )
    job.retries_left = 0
    job.started_at = datetime.fromtimestamp(failed_at - 5, tz=UTC)
    job.ended_at = datetime.fromtimestamp(failed_at, tz=UTC)
    job._exc_info = spec.error
    job.save(pipeline=pipe)
    job.cleanup(ttl=s.result_ttl, pipeline=pipe)
    pipe.zadd(failed_registry, {job_id: failed_at + s.result_ttl})
