"""Keeping leash's state true when RQ's own tools act on leash's jobs.

rq-dashboard's Requeue / Delete / Empty, ``rq requeue``, ``rq empty`` and a plain ``rq worker``
change RQ's keys only. leash notices and makes its own state follow:

    failed ──RQ requeue──────────────────────▶ queued  (a replay: attempts 0, checkpoints and
                                                         error history kept, audit actor "rq")
    queued ──deleted / emptied / RQ record gone──▶ failed  ("removed from the queue outside leash")
    queued ──failed / canceled / stopped by RQ───▶ failed  (RQ's own error text)
    an owner's slot held by a job that will not run ──▶ released

``sweep`` does it for every job within one reaper tick (``Reaper.tick``); a worker that dequeues
a requeued job replays it at once; a status read already tells the truth (``jobs.states``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from redis import Redis
from rq.job import Job
from rq.rate_limit import RateLimitRegistry
from rq.results import Result
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.config import settings
from jobs.core import clock, lua, state_index
from jobs.core.lease import error_entry, truncate
from jobs.core.rq_side import ENDED_BY_RQ, PLAIN_WORKER, REMOVED, requeued_by_rq  # noqa: F401 (PLAIN_WORKER: read as consistency.PLAIN_WORKER)
from jobs.core.text import decoded

log = logging.getLogger("leash.consistency")

#: Jobs checked per sweep; the sweep resumes where it stopped on the next tick.
SWEEP_BATCH = 2000
#: Waiting jobs checked per owner and sweep: the next to be promoted (a requeued job further
#: back is still reported queued by a status read, and replayed when a worker dequeues it).
WAITING_CHECKED = 100
#: leash states of a job that will not run again (None: its record expired).
ENDED = (None, "succeeded", "failed")
OWNER_LIMIT_PREFIX = keys.owner_rate_limit_key("")


def end_outside(connection: Redis, job_id: str, message: str, now: float | None = None) -> bool:
    """Fail a still-queued job that RQ's tools ended; frees its owner's slot. True if done."""
    now = clock.wall() if now is None else now
    owner, kind, attempts = (decoded(v) for v in connection.hmget(keys.job(job_id), "owner", "kind", "attempts"))
    kind = kind or ""
    # RQ's own cancel is a cancel: counted apart from failures, like leash's.
    outcome = "canceled" if message == ENDED_BY_RQ["canceled"] else "failed"
    ended = lua.run(
        connection, "end_outside_v2",
        keys=[keys.job(job_id), keys.errors(job_id), keys.items(job_id), keys.payload(job_id),
              keys.FAILED_INDEX, keys.ACTIVE] + keys.outcome_keys(outcome, kind, now)
        + keys.owner_state_indexes(owner or ""),
        args=[job_id, now, message, error_entry(int(attempts or 0), message, now), settings().result_ttl,
              f"{outcome}:{kind}", keys.STATS_MINUTE_TTL],
    )
    if int(ended) and owner:
        # RQ's own cancel: out of the waiting set, and the slot freed unless RQ still runs it.
        RateLimitRegistry(keys.owner_rate_limit_key(owner), connection).cancel(job_id)
    return bool(int(ended))


def rq_error_text(connection: Redis, job_id: str, rq_status: str) -> str:
    """What RQ recorded about how it ended the job (its latest failure's traceback if any)."""
    headline = ENDED_BY_RQ.get(rq_status, f"ended by RQ ({rq_status})")
    try:
        job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
        result = Result.fetch_latest(job, serializer=JSONSerializer)
    except Exception:  # noqa: BLE001 - RQ's record is only a better error text; the headline stands alone
        return headline
    if result is not None and result.exc_string:
        return truncate(f"{headline}: {result.exc_string.strip()}")
    return headline


def sweep(connection: Redis, now: float | None = None, batch: int = SWEEP_BATCH,
          adopt_requeues: Callable[[Redis, list[str], str], list[str]] | None = None) -> dict[str, int]:
    """One consistency round over leash's active jobs and its owners' rate-limit slots.

    Failed jobs that RQ's tools requeued are handed to ``adopt_requeues`` (the worker passes
    ``jobs.deadletter.adopt_requeues``: a replay belongs to the dead-letter layer, above this
    one); without it they are left for a round that has one (a status read says queued meanwhile)."""
    now = clock.wall() if now is None else now
    counts = {"removed": 0, "ended_by_rq": 0, "requeued": 0, "slots_freed": 0}
    requeued: list[str] = []
    seen: dict[str, list[str]] = {"removed": [], "ended_by_rq": [], "slots_freed": []}
    _sweep_active(connection, now, batch, counts, requeued, seen)
    _sweep_owner_slots(connection, now, counts, requeued, seen)
    if requeued and adopt_requeues is not None:
        counts["requeued"] = len(adopt_requeues(connection, list(dict.fromkeys(requeued)), "rq requeue"))
    _log_round(seen)
    return counts


#: Job ids a summary line names; the rest are counted (an `rq empty` of 20,000 jobs is one line).
IDS_LOGGED = 10


def _log_round(seen: dict[str, list[str]]) -> None:
    """One line per kind of event per round, not one per job: a bulk action behind leash's
    back must not drown the log."""
    def shown(ids: list[str]) -> str:
        return ", ".join(ids[:IDS_LOGGED]) + (f" and {len(ids) - IDS_LOGGED} more" if len(ids) > IDS_LOGGED else "")

    if seen["removed"]:
        log.warning("%d job(s) %s: %s", len(seen["removed"]), REMOVED, shown(seen["removed"]))
    if seen["ended_by_rq"]:
        log.warning("%d job(s) ended by RQ's own tools (canceled or stopped), recorded as failed: %s",
                    len(seen["ended_by_rq"]), shown(seen["ended_by_rq"]))
    if seen["slots_freed"]:
        # Routine bookkeeping (a job that failed for good still held its slot in RQ): no one need act.
        log.info("freed %d owner-limit slot(s) held by jobs that will not run: %s", len(seen["slots_freed"]),
                 shown(seen["slots_freed"]))


def _read(connection: Redis, job_ids: list[str],
          owners: list[str | None] | None = None) -> list[tuple[str | None, float | None, str | None]]:
    """(leash state, leash ended_at, RQ status) per job, in one round trip; each job's owner
    is appended to ``owners`` when it is given (the state indexes' check needs it)."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), "state", "ended_at", "owner")
            pipe.hget(keys.rq_job(job_id), "status")
        raw = pipe.execute()
    out = []
    for n in range(len(job_ids)):
        state, ended_at, owner = (decoded(v) for v in raw[2 * n])
        out.append((state, float(ended_at) if ended_at else None, decoded(raw[2 * n + 1])))
        if owners is not None:
            owners.append(owner)
    return out


def _sweep_active(connection: Redis, now: float, batch: int, counts: dict, requeued: list,
                  seen: dict[str, list[str]]) -> None:
    start = int(connection.get(keys.SWEEP_CURSOR) or 0)
    job_ids = [decoded(j) for j in connection.zrange(keys.ACTIVE, start, start + batch - 1)]
    connection.set(keys.SWEEP_CURSOR, start + batch if len(job_ids) == batch else 0)
    if not job_ids:
        return
    owners: list[str | None] = []
    rows = _read(connection, job_ids, owners)
    # Every job passes here while queued or running and once as it ends: the place to catch
    # index entries an older release's scripts left behind during a deploy.
    state_index.reconcile(connection, [(job_id, owner, state) for job_id, owner, (state, _, _)
                                       in zip(job_ids, owners, rows, strict=True)], now)
    ended = []
    for job_id, (state, ended_at, rq_status) in zip(job_ids, rows, strict=True):
        if state == "queued" and rq_status is None:
            if end_outside(connection, job_id, REMOVED, now=now):
                counts["removed"] += 1
                seen["removed"].append(job_id)
        elif state == "queued" and rq_status in ENDED_BY_RQ:
            if end_outside(connection, job_id, rq_error_text(connection, job_id, rq_status), now=now):
                counts["ended_by_rq"] += 1
                seen["ended_by_rq"].append(f"{job_id} ({rq_status})")
        elif state in ENDED:
            ended.append(job_id)
            if requeued_by_rq(state, rq_status, ended_at, now):
                requeued.append(job_id)
    if ended:
        connection.zrem(keys.ACTIVE, *ended)
        _repair_expiries(connection, ended)


def _repair_expiries(connection: Redis, job_ids: list[str]) -> None:
    """An ended job's payload copy expires with its record. A worker of the release before the
    copy existed ends jobs with scripts that do not know it, leaving it without an expiry
    (up to LEASH_MAX_PAYLOAD_BYTES each, forever): each ended job is seen here once, and its
    copy gets the record's remaining time."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.ttl(keys.job(job_id))
            pipe.ttl(keys.payload(job_id))
        ttls = pipe.execute()
        for n, job_id in enumerate(job_ids):
            job_ttl, payload_ttl = ttls[2 * n], ttls[2 * n + 1]
            if payload_ttl == -1 and job_ttl > 0:
                pipe.expire(keys.payload(job_id), job_ttl)
        if pipe.command_stack:
            pipe.execute()


def _sweep_owner_slots(connection: Redis, now: float, counts: dict, requeued: list,
                       seen: dict[str, list[str]]) -> None:
    """Every job holding or waiting for an owner's slot: requeued failed jobs are replayed,
    and a slot held by a job that will not run (ended, deleted) is freed."""
    limits = [decoded(k) for k in connection.smembers(RateLimitRegistry.rl_keys_key)]
    registries = [RateLimitRegistry(k, connection) for k in limits if k and k.startswith(OWNER_LIMIT_PREFIX)]
    if not registries:
        return
    with connection.pipeline(transaction=False) as pipe:
        for registry in registries:
            pipe.zrange(registry.allowed_key, 0, -1)
            pipe.zrange(registry.rate_limited_key, 0, WAITING_CHECKED - 1)
        members = pipe.execute()
    holders: list[tuple[RateLimitRegistry, str, bool]] = []  # (registry, job id, holds a slot)
    for n, registry in enumerate(registries):
        holders += [(registry, decoded(j), True) for j in members[2 * n]]
        holders += [(registry, decoded(j), False) for j in members[2 * n + 1]]
    if not holders:
        return
    rows = _read(connection, [job_id for _, job_id, _ in holders])
    for (registry, job_id, holds_slot), (state, ended_at, rq_status) in zip(holders, rows, strict=True):
        if requeued_by_rq(state, rq_status, ended_at, now):
            requeued.append(job_id)
        elif holds_slot and state in ENDED and rq_status not in ("queued", "started"):
            registry.release_stale_and_enqueue(job_id)
            if connection.zscore(registry.allowed_key, job_id) is None:
                counts["slots_freed"] += 1
                seen["slots_freed"].append(f"{job_id} ({state or 'gone'})")
