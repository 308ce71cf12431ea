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
import time

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


#: RQ's loggers whose ERROR lines about an unreachable Redis are rewritten (RQ's own workers,
#: its retry scheduler).
RQ_LOGGERS = ("rq.worker", "rq.scheduler")
#: How long after the last "could not connect" line the next one starts a new outage.
OUTAGE_GAP_SECONDS = 60.0


class RiddenOut(logging.Filter):
    """A failover, a restart or a network blip that the worker rides out is not an error: RQ's
    ERROR lines about it (``could not connect to Redis instance … retrying``, an exception
    record carrying a Redis connection error) become WARNINGs that say what the worker does
    and since when. What leash gives up on keeps its ERROR."""

    def __init__(self, clock=time.monotonic):
        super().__init__()
        self.clock = clock
        self.since: float | None = None
        self.last: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.ERROR:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if "could not connect to Redis" in str(record.msg):
            now = self.clock()
            if self.since is None or self.last is None or now - self.last > OUTAGE_GAP_SECONDS:
                self.since = now
            self.last = now
            record.msg = (str(record.msg).rstrip(".") + " (Redis unreachable for %.0f s so far; the worker stays "
                          "up, retries with backoff of at most 5 s, and running jobs resume once it answers)")
            record.args = (*(record.args or ()), now - self.since)
        elif isinstance(exc, REDIS_DOWN):
            record.msg = f"{record.msg} (Redis unreachable: ridden out, this process carries on or is restarted)"
        else:
            return True
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_ridden_out = RiddenOut()


def quiet_ridden_out_errors() -> None:
    """Install ``RiddenOut`` on RQ's loggers (once; a worker calls it as it starts)."""
    for name in RQ_LOGGERS:
        logger = logging.getLogger(name)
        if _ridden_out not in logger.filters:
            logger.addFilter(_ridden_out)


def _progress(attempt: Attempt) -> str:
    """``done/total`` as stored; the attempt's last known count if Redis cannot say."""
    try:
        done, total = attempt.connection.hmget(keys.job(attempt.job_id), "done", "total")
    except redis.exceptions.RedisError:
        return f"{attempt.done}/?"
    return f"{int(done or 0)}/{int(total) if total is not None else '?'}"
