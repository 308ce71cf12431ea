"""An owner's jobs, newest first, optionally only those in one state (the jobs page, ``GET
/jobs``, ``leash jobs``). Reads the owner's index, never scans Redis."""

from __future__ import annotations

from typing import Any

from redis import Redis

from . import clock, keys, states

#: A state filter looks at this many of the owner's newest jobs at most.
MAX_SCAN = 10_000
_CHUNK = 500


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _ids_in_state(connection: Redis, owner: str, state: str, now: float) -> list[str]:
    ids = [_text(i) for i in connection.zrevrange(keys.owner_jobs(owner), 0, MAX_SCAN - 1)]
    matching = []
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start:start + _CHUNK]
        with connection.pipeline(transaction=False) as pipe:
            for job_id in chunk:
                pipe.hmget(keys.job(job_id), "state", "lease_expires_at", "ended_at")
                pipe.hget(keys.rq_job(job_id), "status")
            replies = pipe.execute()
        for n, job_id in enumerate(chunk):
            (leash_state, lease, ended), rq_status = replies[2 * n], replies[2 * n + 1]
            if leash_state is None:
                continue
            decided, _, _ = states.decide(_text(leash_state), _text(rq_status),
                                          float(lease) if lease else None, now,
                                          ended_at=float(ended) if ended else None)
            if decided.value == state:
                matching.append(job_id)
    return matching


def list_jobs(connection: Redis, owner: str, offset: int, limit: int, state: str | None = None,
              now: float | None = None) -> tuple[int, list[dict[str, Any]]]:
    """(how many jobs match, the status fields of one page of them, newest first). With a
    ``state``, the count covers the owner's newest MAX_SCAN jobs."""
    now = clock.wall() if now is None else now
    index = keys.owner_jobs(owner)
    if state is None:
        with connection.pipeline(transaction=False) as pipe:
            pipe.zcard(index)
            pipe.zrevrange(index, offset, offset + limit - 1)
            total, raw_ids = pipe.execute()
        ids = [_text(i) for i in raw_ids]
    else:
        matching = _ids_in_state(connection, owner, state, now)
        total, ids = len(matching), matching[offset:offset + limit]
    if not ids:
        return total, []
    with connection.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hgetall(keys.job(job_id))
            pipe.hget(keys.rq_job(job_id), "status")
        replies = pipe.execute()
    listing = []
    for n, job_id in enumerate(ids):
        raw, rq_status = replies[2 * n], replies[2 * n + 1]
        if raw:
            listing.append(states.from_raw(job_id, raw, _text(rq_status), now=now))
        else:  # the job's record expired (LEASH_RESULT_TTL after it ended): trim the index as met
            connection.zrem(index, job_id)
    return total, listing
