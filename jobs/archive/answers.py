"""The request cache in the archive: an answer unused in Redis for LEASH_REDIS_KEEP moves to
``leash_answers`` (keyed by its entry: the cache scope and the request digest), so an ended job's
answers cost Redis nothing after the keep time and are still never paid for twice.

    the archive's sweep ─▶ retire: entries whose last use is older than the keep time are
                           copied to SQL, then dropped from Redis (cache_retire_v1, which keeps
                           one a hit used meanwhile)
    a cache miss in Redis ─▶ lookup (jobs.models.cache.archived, set at the start of a worker,
                           the web app and every ``leash`` command): the archive's answer, a hit as
                           any other; a worker's hit (lookup_to_use) marks the answer used now
    the sweep ─▶ expire: answers unused for LEASH_CACHE_DAYS leave the archive too

A copy written twice (a crash between the commit and the drop) replaces itself. With the
archive unreachable, a lookup is a miss (the model is asked, as without a cache) and retiring
waits: the entries stay in Redis."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

from redis import Redis
from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from jobs import keys
from jobs.archive import database, tables
from jobs.config import answer_cache, stores
from jobs.core.text import decoded
from jobs.lifecycle import scripts

log = logging.getLogger("leash.archive")

#: Entries one sweep moves at most.
BATCH = 1000


def retire(connection: Redis, engine: Engine, now: float | None = None) -> int:
    """Move the cache entries unused for LEASH_REDIS_KEEP to the archive; returns how many left
    Redis. Raises SQLAlchemyError when the archive cannot be reached (nothing left Redis)."""
    now = time.time() if now is None else now
    found = connection.zrangebyscore(keys.CACHE_INDEX, "-inf", now - stores.archive().redis_keep,
                                     start=0, num=BATCH, withscores=True)
    if not found:
        return 0
    names = [decoded(name) for name, _ in found]
    values = connection.mget(names)
    rows = [{"entry": name, "answer": decoded(value), "used_at": datetime.fromtimestamp(score, UTC)}
            for name, (_, score), value in zip(names, found, values, strict=True) if value is not None]
    if rows:
        with engine.begin() as sql:
            sql.execute(delete(tables.answers).where(tables.answers.c.entry.in_([r["entry"] for r in rows])))
            sql.execute(insert(tables.answers), rows)
    return int(scripts.run(connection, "cache_retire_v1", {
        "index": keys.CACHE_INDEX, "sizes": keys.CACHE_SIZES, "total": keys.CACHE_BYTES, "entries": names},
        [max(score for _, score in found)]))


def expire(engine: Engine, now: float | None = None) -> int:
    """Delete the archived answers unused for LEASH_CACHE_DAYS."""
    now = time.time() if now is None else now
    before = datetime.fromtimestamp(now, UTC) - timedelta(days=answer_cache().cache_days)
    with engine.begin() as sql:
        return sql.execute(delete(tables.answers).where(tables.answers.c.used_at < before)).rowcount


_warned = False


def lookup(names: list[str], connection=None, touch: bool = False) -> dict[str, str]:
    """{entry: cached answer} of the ``names`` the archive holds, unused for less than
    LEASH_CACHE_DAYS; {} without an archive or while it does not answer (a miss: the model is asked).
    The archive is the configured one, else that of the ``leash dev`` whose Redis ``connection``
    is (the command line marks its connection so). With ``touch`` (a worker about to use the
    answers, not a dry run's price) the answers found are marked used now, as a hit in Redis is:
    an answer in use never leaves the archive for LEASH_CACHE_DAYS."""
    global _warned
    url = database.configured_url() or getattr(connection, "leash_archive_url", None)
    if not names or url is None:
        return {}
    now = datetime.now(UTC)
    before = now - timedelta(days=answer_cache().cache_days)
    c = tables.answers.c
    try:
        # No migration here: a work-horse asks this once per job, and the worker migrated at start.
        with database.engine(url, migrate_first=False).connect() as sql:
            found = {entry: answer for entry, answer in sql.execute(
                select(c.entry, c.answer).where(c.entry.in_(names)).where(c.used_at >= before))}
            if touch and found:
                sql.execute(update(tables.answers).where(c.entry.in_(list(found))).values(used_at=now))
                sql.commit()
    except SQLAlchemyError as exc:
        if not _warned:
            log.warning("the archive did not answer a request-cache lookup (asked the model instead): %s",
                        str(exc).splitlines()[0])
            _warned = True
        return {}
    _warned = False
    return found


def lookup_to_use(names: list[str], connection=None) -> dict[str, str]:
    """``lookup`` by a worker, whose hits are used: each answer found is marked used now."""
    return lookup(names, connection, touch=True)
