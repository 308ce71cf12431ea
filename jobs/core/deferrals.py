"""Jobs deferred while they wait for something outside them: room in a budget (budget), their
model provider back after it failed every call (provider). The runner notes such a deferral on
the job (``waiting_for``, ``waiting_since``) and in an index per reason, and clears the job's
note when it runs again; /metrics counts the index (pruning what no longer waits), the job page
says what the job waits for."""

from __future__ import annotations

from redis import Redis

from jobs import keys

REASONS = ("budget", "provider")
INDEX = {"budget": keys.WAITING_BUDGET, "provider": keys.WAITING_PROVIDER}
#: How many entries of an index one count reads (a count past it is still exact: ZCARD).
PRUNE_LIMIT = 1000


def note(connection: Redis, job_id: str, reason: str, since: float) -> None:
    with connection.pipeline(transaction=False) as pipe:
        pipe.hset(keys.job(job_id), mapping={"waiting_for": reason, "waiting_since": since})
        pipe.zadd(INDEX[reason], {job_id: since})
        pipe.execute()


def clear(connection: Redis, job_id: str) -> None:
    """The job runs again: whatever it waited for is back (or it defers anew)."""
    connection.hdel(keys.job(job_id), "waiting_for")


def counts(connection: Redis) -> dict[str, int]:
    """How many jobs wait, per reason: queued and still noted as waiting for it."""
    found = {}
    for reason in REASONS:
        index = INDEX[reason]
        members = [m.decode() for m in connection.zrange(index, 0, PRUNE_LIMIT - 1)]
        with connection.pipeline(transaction=False) as pipe:
            for job_id in members:
                pipe.hmget(keys.job(job_id), "waiting_for", "state")
            rows = pipe.execute()
        gone = [job_id for job_id, (why, state) in zip(members, rows, strict=True)
                if why != reason.encode() or state != b"queued"]
        if gone:
            connection.zrem(index, *gone)
        found[reason] = connection.zcard(index)
    return found


def oldest(connection: Redis, reason: str) -> tuple[int, float | None]:
    """How many jobs wait for ``reason``, and since when the longest-waiting one has."""
    count = counts(connection)[reason]
    first = connection.zrange(INDEX[reason], 0, 0, withscores=True)
    return count, (first[0][1] if first else None)
