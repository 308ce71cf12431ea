"""What a worker logs when an attempt ends without the job failing.

RQ logs every exception a job raises as an ERROR with its traceback. Several of leash's
exceptions are not failures: a deploy hands the job back (``HandOff``), a Redis blip hands
it back too, a cancel is the user's wish, and an attempt that lost its lease only learns
that another attempt owns the job. Each gets one line, at INFO or WARNING, with the job
id and how far it got, so log-based alerts fire on real failures only (those keep RQ's
ERROR and traceback).
"""

from __future__ import annotations

import logging

import redis

from jobs import keys
from jobs.core.lease import Attempt, Outcome
from jobs.errors import Canceled, HandOff, LeaseLost

log = logging.getLogger("leash.worker")

REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def log_not_a_failure(attempt: Attempt, exc: BaseException | None, how: str = "at shutdown") -> bool:
    """Log how ``attempt`` ended if that was not a failure, and return True; return False
    (nothing logged) for a real failure, which RQ logs with its traceback."""
    if attempt.outcome == Outcome.HANDED_OFF and (exc is None or isinstance(exc, HandOff)):
        log.info("job %s handed back %s: %s items done, back at the front of its queue, attempt not counted",
                 attempt.job_id, how, _progress(attempt))
    elif attempt.outcome == Outcome.HANDED_OFF and isinstance(exc, REDIS_DOWN):
        log.warning("job %s handed back after a Redis error (%s: %s): %s items done, attempt not counted",
                    attempt.job_id, type(exc).__name__, exc, _progress(attempt))
    elif isinstance(exc, Canceled):
        log.info("job %s canceled: %s items done", attempt.job_id, _progress(attempt))
    elif attempt.outcome == Outcome.SUPERSEDED and isinstance(exc, (LeaseLost, HandOff, *REDIS_DOWN)):
        log.warning("job %s: attempt %s lost its lease (the job was reclaimed); it stopped without writing",
                    attempt.job_id, attempt.number)
    else:
        return False
    return True


def _progress(attempt: Attempt) -> str:
    """``done/total`` as stored; the attempt's last known count if Redis cannot say."""
    try:
        done, total = attempt.connection.hmget(keys.job(attempt.job_id), "done", "total")
    except redis.exceptions.RedisError:
        return f"{attempt.done}/?"
    return f"{int(done or 0)}/{int(total) if total is not None else '?'}"
