"""Each owner's jobs indexed by state: the ``state=`` filter of listings and the queued count
of admission, exact at any number of jobs.

One sorted set per owner and state (``keys.owner_state``), scored by creation time so a
filtered listing is newest first like the unfiltered one. ``enqueue`` puts a job in the
queued index in its own transaction; from then on the Lua script that changes the job's state
moves it in the same atomic step (``index_state`` in jobs/lua/_lib.lua), so the index is never
behind the job. An ended job's entry leaves with the job: the scripts record in the owner's
expiries when its record expires, and ``trim_expired`` drops the due entries before a read
counts them; the keys holding ended jobs carry a TTL at least as long as their newest entry.

Redis outlives releases, so two kinds of jobs have no entry or a wrong one after an upgrade:
jobs written before the indexes existed, and jobs moved by an older release's scripts while
old and new workers overlap during the deploy. The first are indexed once (``backfill_step``,
run by the reaper and by the first filtered listings, resumable, finished with a marker key);
until the marker is set a filtered listing reads the jobs themselves, as before. The second
are repaired by the consistency sweep, which checks every job whose owner's sets moved and,
in its rotation, every queued or running job and every job as it ends (``reconcile``), and by
a listing that meets one (``repair``).
"""

from __future__ import annotations

from redis import Redis

from jobs import keys
from jobs.config import settings
from jobs.core import clock
from jobs.core.text import decoded
from jobs.lifecycle import transitions

#: Jobs indexed per backfill step (a reaper tick or a listing that finds the marker missing).
BACKFILL_STEP = 5000
_SCAN_COUNT = 1000
_TRIM_BATCH = 1000


def ready(connection: Redis) -> bool:
    """True once every job written before the indexes existed has been indexed."""
    return bool(connection.exists(keys.STATE_INDEX_READY))


def count(connection: Redis, owner: str, state: str) -> int:
    """How many of the owner's jobs are in this leash state (queued and running jobs never
    expire, so no trim is needed for them)."""
    return connection.zcard(keys.owner_state(owner, state))


def trim_expired(connection: Redis, owner: str, now: float | None = None, pipeline=None) -> int:
    """Drop the owner's entries of ended jobs whose records have expired, and give the owner's
    job index the TTL of the jobs it lists (``owner_index_expiry_v1``); returns how many
    entries went. Run by listings before they count, and as each of the owner's jobs ends, so
    no entry outlives its job by more than that owner's next ended job, and no index key
    outlives the owner's last job. With ``pipeline``, one batch is queued on it instead."""
    now = clock.wall() if now is None else now
    if pipeline is not None:
        transitions.owner_index_expiry(connection, owner, [now, _TRIM_BATCH], pipeline=pipeline)
        return 0
    trimmed = 0
    for _ in range(10_000):  # bounded: 10 million due entries, far past any owner's
        dropped, more = transitions.owner_index_expiry(connection, owner, [now, _TRIM_BATCH])
        trimmed += int(dropped)
        if not int(more):
            break
    return trimmed


def repair(connection: Redis, job_ids: list[str], owners: list[str | None], now: float | None = None) -> None:
    """Put each job in the right index of its owner, atomically per job (``index_job_v1``),
    then let each owner's job index expire with its jobs, or not, as it now must: a job a
    previous-release worker ended (its scripts know no index) may have been its owner's last."""
    now = clock.wall() if now is None else now
    ttl = settings().result_ttl
    with connection.pipeline(transaction=False) as pipe:
        for job_id, owner in zip(job_ids, owners, strict=True):
            transitions.index_job(connection, job_id, owner or "", [job_id, now, ttl], pipeline=pipe)
        for owner in sorted({owner for owner in owners if owner}):
            trim_expired(connection, owner, now, pipeline=pipe)
        pipe.execute()


def _expire_owner_indexes(connection: Redis, now: float | None = None) -> None:
    """Once the backfill is done, every owner's job index gets the expiry its jobs give it:
    owners whose jobs all ended before the marker was set were left without one (the expiry
    script leaves an index alone until then), and no later end would revisit them."""
    cursor = 0
    while True:
        cursor, found = connection.scan(cursor, match=keys.OWNER_JOBS_PATTERN, count=_SCAN_COUNT)
        if found:
            with connection.pipeline(transaction=False) as pipe:
                for key in found:
                    trim_expired(connection, keys.owner_of_jobs_key(decoded(key)), now, pipeline=pipe)
                pipe.execute()
        if cursor == 0:
            return


def reconcile(connection: Redis, jobs: list[tuple[str, str | None, str | None]], now: float | None = None) -> int:
    """Repair the jobs of the consistency sweep's batch, given as (id, owner, state) as it read
    them, that are missing from the index of their state: moved by an older release's scripts,
    or written before the indexes. One round trip when all is well; returns how many were
    repaired (each by a script that reads the job's state again, so a job that moved since
    the sweep read it is indexed as it is now)."""
    known = [(job_id, owner, state) for job_id, owner, state in jobs if owner and state]
    if not known:
        return 0
    with connection.pipeline(transaction=False) as pipe:
        for job_id, owner, state in known:
            pipe.zscore(keys.owner_state(owner, state), job_id)
        scores = pipe.execute()
    # A job in the index of its state is in no other (every script moves it out of all the rest).
    wrong = [(job_id, owner) for (job_id, owner, _), score in zip(known, scores, strict=True) if score is None]
    if wrong:
        repair(connection, [j for j, _ in wrong], [o for _, o in wrong], now)
    return len(wrong)


def backfill_step(connection: Redis, budget: int = BACKFILL_STEP, now: float | None = None) -> bool:
    """Index up to ``budget`` more jobs written before the indexes existed, resuming where the
    last step stopped (a SCAN cursor in Redis); sets the marker when every job has been seen.
    Returns whether the indexes are complete. Safe to run in several processes at once: each
    job is indexed by one atomic script that reads its current state."""
    if ready(connection):
        return True
    cursor = int(connection.get(keys.STATE_INDEX_CURSOR) or 0)
    prefix = len(keys.job(""))
    seen = 0
    while True:
        cursor, found = connection.scan(cursor, match=keys.JOB_PATTERN, count=_SCAN_COUNT)
        job_ids = [decoded(key)[prefix:] for key in found]
        if job_ids:
            with connection.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hget(keys.job(job_id), "owner")
                owners = [decoded(o) for o in pipe.execute()]
            owned = [(job_id, owner) for job_id, owner in zip(job_ids, owners, strict=True) if owner]
            repair(connection, [j for j, _ in owned], [o for _, o in owned], now)
            seen += len(job_ids)
        if cursor == 0:
            # Jobs written from now on are indexed as they are written: the old world is done.
            with connection.pipeline() as pipe:
                pipe.set(keys.STATE_INDEX_READY, clock.wall())
                pipe.delete(keys.STATE_INDEX_CURSOR)
                pipe.execute()
            _expire_owner_indexes(connection, now)
            return True
        if seen >= budget:
            # The cursor lives a day: a step resumed after that starts the scan again, harmlessly.
            connection.set(keys.STATE_INDEX_CURSOR, cursor, ex=24 * 3600)
            return False
