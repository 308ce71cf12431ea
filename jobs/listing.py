"""An owner's jobs, newest first, optionally only those in one state (the jobs page, ``GET
/jobs``, ``leash jobs``). Reads the owner's indexes, never scans Redis: a state filter reads
the owner's index of that state (jobs/state_index.py), exact and as fast at any number of jobs.

The state indexes follow leash's own state. A job that RQ's tools ended or requeued behind
leash's back reads in its new state at once (``states.decide``) and moves index at the next
consistency sweep (one reaper tick); meanwhile a filtered page leaves it out rather than show
it under the wrong state.
"""

from __future__ import annotations

from typing import Any

from redis import Redis

from . import clock, keys, state_index, states

#: Before the one-time indexing of older jobs has finished, a state filter looks at this many
#: of the owner's newest jobs at most (the way every filter read before the indexes).
MAX_SCAN = 10_000
_CHUNK = 500


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _scanned_ids_in_state(connection: Redis, owner: str, state: str, now: float) -> list[str]:
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


def _indexed_page(connection: Redis, owner: str, state: str, offset: int, limit: int,
                  now: float) -> tuple[int, list[str]] | None:
    """(count, one page of ids) from the owner's index of ``state``; None until older jobs
    are indexed (a step of that indexing runs here first, so a small store is ready at once)."""
    if not state_index.ready(connection) and not state_index.backfill_step(connection, now=now):
        return None
    state_index.trim_expired(connection, owner, now)
    index = keys.owner_state(owner, state)
    with connection.pipeline(transaction=False) as pipe:
        pipe.zcard(index)
        pipe.zrevrange(index, offset, offset + limit - 1)
        total, raw_ids = pipe.execute()
    return total, [_text(i) for i in raw_ids]


def list_jobs(connection: Redis, owner: str, offset: int, limit: int, state: str | None = None,
              now: float | None = None) -> tuple[int, list[dict[str, Any]]]:
    """(how many jobs match, the status fields of one page of them, newest first)."""
    now = clock.wall() if now is None else now
    index = keys.owner_jobs(owner)
    if state is None:
        with connection.pipeline(transaction=False) as pipe:
            pipe.zcard(index)
            pipe.zrevrange(index, offset, offset + limit - 1)
            total, raw_ids = pipe.execute()
        ids = [_text(i) for i in raw_ids]
    else:
        page = _indexed_page(connection, owner, state, offset, limit, now)
        if page is None:
            matching = _scanned_ids_in_state(connection, owner, state, now)
            total, ids = len(matching), matching[offset:offset + limit]
        else:
            total, ids = page
    if not ids:
        return total, []
    with connection.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hgetall(keys.job(job_id))
            pipe.hget(keys.rq_job(job_id), "status")
        replies = pipe.execute()
    listing, misplaced = [], []
    for n, job_id in enumerate(ids):
        raw, rq_status = replies[2 * n], replies[2 * n + 1]
        if not raw:  # the job's record expired (LEASH_RESULT_TTL after it ended): trim the index as met
            connection.zrem(index, job_id)
            if state is not None:
                state_index.repair(connection, [job_id], [owner], now)
            continue
        fields = states.from_raw(job_id, raw, _text(rq_status), now=now)
        if state is not None and fields["state"] != state:
            if _text(raw.get(b"state")) != state:
                misplaced.append(job_id)  # moved by an older release's script: repaired as met
            continue
        listing.append(fields)
    if misplaced:
        state_index.repair(connection, misplaced, [owner] * len(misplaced), now)
    return total, listing
