"""The archive's Redis side: which ended jobs wait to be written to SQL (``keys.ARCHIVE_DUE``)
and what the last writes met (``keys.ARCHIVE_STATUS``). Imports nothing but the key names, so
the lifecycle core can note a job's end here (jobs/core/retention.py)."""

from __future__ import annotations

import time

from redis import Redis

from jobs import keys


def note_ended(connection: Redis, job_id: str, archive_url: str | None, pipeline=None) -> None:
    """The job may have ended: the archive's sweep writes it (or finds it still running and lets
    it go until it ends). Nothing without an archive (``archive_url`` None, from
    ``jobs.config.stores``): results stay in Redis as they always did."""
    if archive_url is None:
        return
    (pipeline or connection).zadd(keys.ARCHIVE_DUE, {job_id: time.time()}, nx=True)


def due(connection: Redis, limit: int) -> list[str]:
    """The oldest ``limit`` job ids waiting to be archived."""
    return [v.decode() if isinstance(v, bytes) else v for v in connection.zrange(keys.ARCHIVE_DUE, 0, limit - 1)]


def done(connection: Redis, job_ids: list[str]) -> None:
    if job_ids:
        connection.zrem(keys.ARCHIVE_DUE, *job_ids)


def record_ok(connection: Redis, now: float) -> None:
    connection.hset(keys.ARCHIVE_STATUS, mapping={"ok_at": now})


def record_error(connection: Redis, error: str, now: float) -> None:
    connection.hset(keys.ARCHIVE_STATUS, mapping={"error": error[:500], "error_at": now})


def behind(connection: Redis, now: float | None = None) -> dict:
    """How far behind the archive is: how many ended jobs wait, for how long the oldest has,
    and the last error its writes met (with when) if none succeeded since."""
    now = time.time() if now is None else now
    with connection.pipeline(transaction=False) as pipe:
        pipe.zcard(keys.ARCHIVE_DUE)
        pipe.zrange(keys.ARCHIVE_DUE, 0, 0, withscores=True)
        pipe.hgetall(keys.ARCHIVE_STATUS)
        waiting, oldest, status = pipe.execute()
    status = {k.decode(): v.decode() for k, v in status.items()}
    error = status.get("error")
    if error and float(status.get("ok_at") or 0) > float(status.get("error_at") or 0):
        error = None
    return {"waiting": int(waiting), "oldest_seconds": round(now - oldest[0][1], 1) if oldest else 0.0,
            "error": error}
