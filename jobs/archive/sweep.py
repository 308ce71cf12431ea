"""The archive's sweep, run by every worker beside its reaper (one worker at a time, by a shared
throttle) and by ``leash archive backfill``: writes the ended jobs that are due, then lets the
archive's rows older than LEASH_RESULT_TTL go. No lease is held: the job has ended.

With the archive unreachable nothing is lost: the due jobs stay due, and whole in Redis (their
heavy keys leave only once archived), the error is recorded for ``/readyz`` and ``leash doctor``,
and the next sweep (after a pause, so an unreachable database does not slow every tick) tries
again."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

from alembic.util import CommandError
from redis import Redis
from sqlalchemy import delete, select
from sqlalchemy.exc import SQLAlchemyError

from jobs import keys
from jobs.archive import answers, database, pending, tables, writing
from jobs.config import settings

log = logging.getLogger("leash.archive")

#: Jobs one sweep archives at most (it stops sooner once it has worked TIME_BUDGET seconds).
BATCH = 50
TIME_BUDGET = 2.0
#: Seconds between this process's sweeps, and after an error.
INTERVAL = 1.0
PAUSE_AFTER_ERROR = 10.0

_next_at = 0.0


def tick(connection: Redis) -> int:
    """What a worker calls on every reaper tick: a sweep when this process's interval has passed
    and no other worker is sweeping. Returns how many jobs it archived."""
    global _next_at
    if database.configured_url() is None or time.monotonic() < _next_at:
        return 0
    _next_at = time.monotonic() + INTERVAL
    if not connection.set(keys.ARCHIVE_THROTTLE, "1", nx=True, px=int(TIME_BUDGET * 1000) + 30_000):
        return 0
    try:
        return sweep(connection)
    except (SQLAlchemyError, CommandError, OSError) as exc:
        _next_at = time.monotonic() + PAUSE_AFTER_ERROR
        pending.record_error(connection, f"{type(exc).__name__}: {exc}".splitlines()[0], time.time())
        log.warning("archive unreachable, ended jobs stay whole in Redis until it answers: %s",
                    str(exc).splitlines()[0])
        return 0
    finally:
        connection.delete(keys.ARCHIVE_THROTTLE)


def sweep(connection: Redis, limit: int = BATCH, budget: float = TIME_BUDGET, now: float | None = None) -> int:
    """Archive the due jobs (oldest first, up to ``limit`` or ``budget`` seconds), then drop the
    archive's rows past the retention. Raises SQLAlchemyError when the archive cannot be reached."""
    engine = database.engine()
    if engine is None:
        return 0
    started, written, seen = time.monotonic(), 0, []
    for job_id in pending.due(connection, limit):
        written += writing.archive_one(connection, engine, job_id, now)
        seen.append(job_id)
        if time.monotonic() - started > budget:
            break
    pending.done(connection, seen)
    answers.retire(connection, engine, now)  # the request cache's answers unused for the keep time
    expire(engine, now)
    pending.record_ok(connection, time.time() if now is None else now)
    return written


def expire(engine, now: float | None = None) -> int:
    """Delete the archived jobs (and their items) that ended longer than LEASH_RESULT_TTL ago,
    and the webhook attempts made that long ago."""
    now = time.time() if now is None else now
    before = datetime.fromtimestamp(now, UTC) - timedelta(seconds=settings().result_ttl)
    with engine.begin() as connection:
        old = select(tables.jobs.c.job_id).where(tables.jobs.c.ended_at < before)
        connection.execute(delete(tables.items).where(tables.items.c.job_id.in_(old)))
        gone = connection.execute(delete(tables.jobs).where(tables.jobs.c.ended_at < before)).rowcount
        connection.execute(delete(tables.webhook_deliveries).where(tables.webhook_deliveries.c.at < before))
    answers.expire(engine, now)
    return gone


def backfill(connection: Redis, batch: int = 500) -> int:
    """Note every ended job Redis holds as due (a SCAN of the job records, resumable: a job noted
    twice is archived once), then archive them; returns how many were noted."""
    noted, cursor = 0, 0
    while True:
        cursor, found = connection.scan(cursor, match=keys.JOB_PATTERN, count=batch)
        ids = [(k.decode() if isinstance(k, bytes) else k)[len(keys.job("")):] for k in found]
        with connection.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hget(keys.job(job_id), "state")
            states = pipe.execute()
        with connection.pipeline(transaction=False) as pipe:
            for job_id, state in zip(ids, states, strict=True):
                if state in (b"succeeded", b"failed"):
                    pending.note_ended(connection, job_id, database.configured_url(), pipeline=pipe)
                    noted += 1
            pipe.execute()
        if cursor == 0:
            return noted
