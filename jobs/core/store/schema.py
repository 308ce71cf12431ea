"""The layout of leash's data in Redis, versioned, and the migrations between versions.

Redis outlives every release, and during a deploy processes of two releases run against it
at once. ``keys.SCHEMA`` records which layout Redis holds:

    version          the newest schema written to it (by any process)
    compatible_from  the oldest schema whose code may still run against it
    release          the leash release that wrote ``version``; ``at`` when

A worker or web process calls ``ensure`` at start:

- Redis holds an older schema (or none: leash 0.2 wrote no marker, that is schema 1): it runs
  the migrations up to ``VERSION`` and records it. One process migrates, under a lock; every
  step is idempotent (writes only what is missing, reads the old form), so a step repeated
  after a crash or run twice by a process that found the lock expired changes nothing. The
  others do not wait: this release reads both forms, so they start at once.
- Redis holds a schema whose ``compatible_from`` is newer than ``VERSION`` (a release that
  changed the layout beyond what this code reads): the process refuses to start, in one line.
- A newer schema that still accepts this code (``compatible_from`` <= ``VERSION``, the case
  of an old worker restarted during or after a deploy) runs: the release that wrote it
  promised to read what this one writes.

Schema 2 (leash 0.3) keeps ``compatible_from`` at 1: workers of 0.2 may keep running beside
it during the deploy (0.2 reads no marker, so it could not refuse anyway). What 0.3 writes
that 0.2 does not know (state indexes, usage, attempt history, payload copies) 0.2 ignores,
and what 0.2 leaves unfinished 0.3 puts right (docs/OPERATIONS.md, "Upgrading").
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

from redis import Redis
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.config import settings
from jobs.core import clock, payload_copy
from jobs.errors import LeashError

#: The layout this code writes.
VERSION = 2
#: The oldest layout whose code may run beside this one (written with ``VERSION``).
COMPATIBLE_FROM = 1
#: What Redis without a marker holds: written by leash 0.2.
UNMARKED = 1

_SCAN_COUNT = 1000
#: The lock lives this long unless renewed between batches: a migrating process that dies
#: leaves it to the next process to start after that.
LOCK_SECONDS = 60


class SchemaTooNew(LeashError, RuntimeError):
    """Redis holds a layout this code cannot run against."""


def release() -> str:
    try:
        return metadata.version("leash")
    except metadata.PackageNotFoundError:
        return "unknown"


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def stored(connection: Redis) -> dict:
    """The marker as Redis holds it: version, compatible_from (ints), release."""
    raw = {_text(k): _text(v) for k, v in connection.hgetall(keys.SCHEMA).items()}
    version = int(raw.get("version") or UNMARKED)
    return {"version": version, "compatible_from": int(raw.get("compatible_from") or version),
            "release": raw.get("release")}


def check(marker: dict) -> None:
    """SchemaTooNew when Redis was written by a layout that no longer accepts this code."""
    if marker["compatible_from"] > VERSION:
        raise SchemaTooNew(
            f"Redis holds leash data of schema {marker['version']} (written by leash {marker['release'] or '?'}), "
            f"which code older than schema {marker['compatible_from']} cannot run against; this is leash "
            f"{release()} (schema {VERSION}): deploy that release or newer here (docs/OPERATIONS.md#upgrading)")


def ensure(connection: Redis) -> dict:
    """Check the layout Redis holds and bring it up to ``VERSION`` if it is older; returns the
    marker as found. Raises SchemaTooNew (say it in one line and do not start)."""
    marker = stored(connection)
    check(marker)
    if marker["version"] >= VERSION:
        return marker
    lock = connection.lock(keys.SCHEMA_LOCK, timeout=LOCK_SECONDS, blocking=False)
    if not lock.acquire():
        return marker  # another process migrates; this code reads the old forms meanwhile
    try:
        for version in range(marker["version"] + 1, VERSION + 1):
            for step in MIGRATIONS.get(version, ()):
                step(connection, lock.reacquire)
        _record(connection)
    finally:
        if lock.owned():
            lock.release()
    return marker


def _record(connection: Redis) -> None:
    """Write VERSION unless a newer release has recorded its own meanwhile."""
    with connection.pipeline() as pipe:
        pipe.watch(keys.SCHEMA)
        if int(_text(pipe.hget(keys.SCHEMA, "version")) or UNMARKED) >= VERSION:
            return
        pipe.multi()
        pipe.hset(keys.SCHEMA, mapping={"version": VERSION, "compatible_from": COMPATIBLE_FROM,
                                        "release": release(), "at": clock.wall()})
        pipe.execute()


def _scan(connection: Redis, pattern: str, renew: Callable[[], object]):
    """Batches of key names matching ``pattern``, renewing the migration lock between them."""
    cursor = 0
    while True:
        cursor, found = connection.scan(cursor, match=pattern, count=_SCAN_COUNT)
        if found:
            yield [_text(k) for k in found]
            renew()
        if cursor == 0:
            return


def copy_idempotency_keys(connection: Redis, renew: Callable[[], object]) -> int:
    """0.2 wrote an idempotency key as ``leash:idem:<owner>:<key>``, ambiguous when the owner
    holds a colon; 0.3 writes ``leash:idem:<len>:<owner>:<key>``. Each 0.2 key whose job still
    exists gets its 0.3 form (same job, same expiry), told apart by the job's owner. The 0.2
    key stays: 0.2 processes still running during the deploy read it. Returns how many."""
    prefix = len(keys.IDEMPOTENCY_PREFIX)
    copied = 0
    for batch in _scan(connection, keys.IDEMPOTENCY_PATTERN, renew):
        with connection.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.get(key)
                pipe.pttl(key)
            found = pipe.execute()
        job_ids = [_text(found[2 * n]) for n in range(len(batch))]
        with connection.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(keys.job(job_id or ""), "owner")
            owners = [_text(o) for o in pipe.execute()]
        with connection.pipeline(transaction=False) as pipe:
            for n, key in enumerate(batch):
                rest, owner, ttl = key[prefix:], owners[n], found[2 * n + 1]
                if not owner or not rest.startswith(owner + ":") or rest.startswith(f"{len(owner)}:{owner}:"):
                    continue  # the job is gone, or the key is already in this release's form
                new_key = keys.idempotency(owner, rest[len(owner) + 1:])
                pipe.set(new_key, job_ids[n], nx=True, px=ttl if ttl and ttl > 0 else None)
                copied += 1
            pipe.execute()
    return copied


def copy_payloads(connection: Redis, renew: Callable[[], object]) -> int:
    """0.2 kept a job's payload only in RQ's job; 0.3 keeps its own copy (``keys.payload``), from
    which a replay rebuilds a job whose RQ record was deleted. Jobs 0.2 wrote get theirs from
    RQ's job, with the job's expiry; while the job is queued or running, LEASH_RESULT_TTL, as
    enqueue gives it (a 0.2 worker may still end the job, and would leave the copy forever).
    Returns how many."""
    prefix = len(keys.job(""))
    unended_ms = settings().result_ttl * 1000
    copied = 0
    for batch in _scan(connection, keys.JOB_PATTERN, renew):
        job_ids = [key[prefix:] for key in batch]
        with connection.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.exists(keys.payload(job_id))
                pipe.pttl(keys.job(job_id))
            found = pipe.execute()
        missing = [(job_id, found[2 * n + 1]) for n, job_id in enumerate(job_ids) if not found[2 * n]]
        if not missing:
            continue
        rq_jobs = Job.fetch_many([job_id for job_id, _ in missing], connection=connection, serializer=JSONSerializer)
        with connection.pipeline(transaction=False) as pipe:
            for (job_id, ttl), rq_job in zip(missing, rq_jobs, strict=True):
                payload = _payload_of(rq_job)
                if payload is None:
                    continue
                pipe.set(keys.payload(job_id), payload_copy.encode(payload), nx=True,
                         px=ttl if ttl and ttl > 0 else unended_ms)
                copied += 1
            pipe.execute()
    return copied


def _payload_of(rq_job: Job | None) -> dict | None:
    if rq_job is None:
        return None
    try:
        _, payload = rq_job.args
    except (NoSuchJobError, DeserializationError, ValueError, TypeError):
        return None
    return payload if isinstance(payload, dict) else None


#: The steps that bring Redis from the schema before a version up to it.
MIGRATIONS: dict[int, tuple[Callable[[Redis, Callable[[], object]], int], ...]] = {
    2: (copy_idempotency_keys, copy_payloads),
}
