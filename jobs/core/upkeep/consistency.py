"""Keeping leash's state true when RQ's own tools act on leash's jobs.

rq-dashboard's Requeue / Delete / Empty, ``rq requeue``, ``rq empty`` and a plain ``rq worker``
change RQ's keys only. leash notices and makes its own state follow:

    failed ──RQ requeue──────────────────────▶ queued  (a replay: attempts 0, checkpoints and
                                                         error history kept, audit actor "rq")
    queued ──deleted / emptied / RQ record gone──▶ failed  ("removed from the queue outside leash")
    queued ──failed / canceled / stopped by RQ───▶ failed  (RQ's own error text)
    running, waiting at the provider, its look lost in RQ ──▶ the look put back
                                                        (``jobs.core.upkeep.lost_looks``)
    an owner's slot held by a job that will not run ──▶ released

``sweep`` runs at every reaper tick (``Reaper.tick``). What RQ's tools leave behind moves a size
(a queue's list or registry, an owner's rate-limit sets), so the sweep compares sizes and reads
only the jobs where one moved (``jobs.core.upkeep.rq_changes``): a tick where nothing moved costs the same
at 1,000 or 100,000 queued jobs. A slow rotation through every active job (``ROTATION_MIN`` per
tick) catches what moves no size (RQ's record deleted by hand, or expired) and takes ended jobs
out of ACTIVE. A worker that dequeues a requeued job replays it at once; a status read already
tells the truth (``jobs.core.states``).
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
from jobs.core import clock, retention, state_index
from jobs.core.lease import error_entry, truncate
from jobs.core.rq_side import ENDED_BY_RQ, PLAIN_WORKER, REMOVED, requeued_by_rq  # noqa: F401 (PLAIN_WORKER: read as consistency.PLAIN_WORKER)
from jobs.core.text import decoded, summary_of_ids
from jobs.core.upkeep import lost_looks, rq_changes
from jobs.lifecycle import transitions

log = logging.getLogger("leash.consistency")

#: leash states of a job that will not run again (None: its record expired).
ENDED = (None, "succeeded", "failed")


def end_outside(connection: Redis, job_id: str, message: str, now: float | None = None) -> bool:
    """Fail a still-queued job that RQ's tools ended; frees its owner's slot. True if done."""
    now = clock.wall() if now is None else now
    owner, kind, attempts = (decoded(v) for v in connection.hmget(keys.job(job_id), "owner", "kind", "attempts"))
    kind = kind or ""
    # RQ's own cancel is a cancel: counted apart from failures, like leash's.
    outcome = {ENDED_BY_RQ["canceled"]: "canceled", ENDED_BY_RQ["stopped"]: "stopped"}.get(message, "failed")
    ended = transitions.end_outside(
        connection, job_id, owner or "", outcome, kind, now,
        [job_id, now, message, error_entry(int(attempts or 0), message, now), settings().result_ttl,
         f"{outcome}:{kind}", keys.STATS_MINUTE_TTL],
    )
    if int(ended):
        retention.retain(connection, job_id)  # RQ's canceled or failed record goes with it
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


def sweep(connection: Redis, now: float | None = None, batch: int | None = None,
          adopt_requeues: Callable[[Redis, list[str], str], list[str]] | None = None) -> dict[str, int]:
    """One consistency round: the jobs RQ's side changed for since the last round
    (``jobs.core.upkeep.rq_changes``: what a tool deleted, ended or requeued, and owner slots held by
    jobs that will not run), then a bounded slice of the slow rotation through every active job
    (``batch`` jobs, default: as the rotation sized itself).

    Failed jobs that RQ's tools requeued are handed to ``adopt_requeues`` (the worker passes
    ``jobs.deadletter.adopt_requeues``: a replay belongs to the dead-letter layer, above this
    one); without it they are left for a round that has one (a status read says queued meanwhile:
    their owner stays unsettled, so the next round looks at them again)."""
    now = clock.wall() if now is None else now
    counts = {"removed": 0, "ended_by_rq": 0, "requeued": 0, "slots_freed": 0, "looks_put_back": 0}
    requeued: list[str] = []
    seen: dict[str, list[str]] = {"removed": [], "ended_by_rq": [], "slots_freed": []}
    retention.trim_canceled(connection, now)  # before the sizes are read: a trim is not RQ's tools
    changes = rq_changes.observe(connection)
    rotation, size = _rotation_slice(connection, batch)
    rows = _check_jobs(connection, list(dict.fromkeys(changes.job_ids() + [j for j, _ in rotation])), now,
                       counts, requeued, seen)
    _advance_rotation(connection, rotation, rows, size)
    _free_slots(connection, changes.holders, rows, now, counts, requeued, seen)
    rq_changes.record(connection, changes, unsettled_owners=set(changes.suspects))
    if requeued and adopt_requeues is not None:
        counts["requeued"] = len(adopt_requeues(connection, list(dict.fromkeys(requeued)), "rq requeue"))
    _log_round(seen)
    counts["looks_put_back"] = len(lost_looks.put_back_lost(connection, now))
    return counts


def _log_round(seen: dict[str, list[str]]) -> None:
    """One line per kind of event per round, not one per job: a bulk action behind leash's
    back must not drown the log."""
    if seen["removed"]:
        log.warning("%d job(s) %s: %s", len(seen["removed"]), REMOVED, summary_of_ids(seen["removed"]))
    if seen["ended_by_rq"]:
        log.warning("%d job(s) ended by RQ's own tools (canceled or stopped), recorded as failed: %s",
                    len(seen["ended_by_rq"]), summary_of_ids(seen["ended_by_rq"]))
    if seen["slots_freed"]:
        # Routine bookkeeping (a job that failed for good still held its slot in RQ): no one need act.
        log.info("freed %d owner-limit slot(s) held by jobs that will not run: %s", len(seen["slots_freed"]),
                 summary_of_ids(seen["slots_freed"]))


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


def _check_jobs(connection: Redis, job_ids: list[str], now: float, counts: dict, requeued: list,
                seen: dict[str, list[str]]) -> dict[str, tuple[str | None, float | None, str | None]]:
    """Record in leash what RQ's tools did to these jobs; drop the ended ones from ACTIVE.
    Returns each job's row as read (leash state, ended_at, RQ status); a job this round
    failed reads as such."""
    if not job_ids:
        return {}
    owners: list[str | None] = []
    rows = _read(connection, job_ids, owners)
    # Every job passes here while queued or running and once as it ends: the place to catch
    # index entries an older release's scripts left behind during a deploy.
    state_index.reconcile(connection, [(job_id, owner, state) for job_id, owner, (state, _, _)
                                       in zip(job_ids, owners, rows, strict=True)], now)
    ended = []
    by_id = {}
    for job_id, (state, ended_at, rq_status) in zip(job_ids, rows, strict=True):
        by_id[job_id] = (state, ended_at, rq_status)
        if state == "queued" and rq_status is None:
            if end_outside(connection, job_id, REMOVED, now=now):
                counts["removed"] += 1
                seen["removed"].append(job_id)
                by_id[job_id] = ("failed", now, None)
        elif state == "queued" and rq_status in ENDED_BY_RQ:
            if end_outside(connection, job_id, rq_error_text(connection, job_id, rq_status), now=now):
                counts["ended_by_rq"] += 1
                seen["ended_by_rq"].append(f"{job_id} ({rq_status})")
                by_id[job_id] = ("failed", now, rq_status)
        elif state in ENDED:
            ended.append(job_id)
            if requeued_by_rq(state, rq_status, ended_at, now):
                requeued.append(job_id)
    if ended:
        connection.zrem(keys.ACTIVE, *ended)
        _repair_expiries(connection, ended)
    return by_id


#: Jobs the slow rotation through ACTIVE checks per sweep when few end between sweeps: it
#: catches what leaves no size behind (RQ's record deleted by hand, or expired) and takes
#: ended jobs out of ACTIVE. It checks more when more jobs ended (up to ROTATION_MAX), so
#: ACTIVE keeps up with the workers' throughput.
ROTATION_MIN = 200
ROTATION_MAX = 5000


def _rotation_slice(connection: Redis, batch: int | None) -> tuple[list[tuple[str, float]], int]:
    """The next (job id, score) of the rotation, after the last one checked (by creation
    time, then id, as ACTIVE orders them: a job removed before the position shifts nothing
    after it, so none is skipped)."""
    score, member, size = (decoded(v) for v in connection.hmget(keys.SWEEP_ROTATION, "score", "member", "size"))
    size = batch or int(size or ROTATION_MIN)
    if score is None:
        return [(decoded(j), s) for j, s in connection.zrange(keys.ACTIVE, 0, size - 1, withscores=True)], size
    ties = connection.zcount(keys.ACTIVE, score, score)
    after = connection.zrangebyscore(keys.ACTIVE, score, "+inf", start=0, num=size + ties, withscores=True)
    return [(decoded(j), s) for j, s in after if s > float(score) or decoded(j) > member][:size], size


def _advance_rotation(connection: Redis, rotation: list[tuple[str, float]], rows: dict, size: int) -> None:
    ended = sum(1 for job_id, _ in rotation if rows[job_id][0] in ENDED)
    next_size = max(ROTATION_MIN, min(ROTATION_MAX, 2 * ended))
    with connection.pipeline(transaction=False) as pipe:
        pipe.delete(keys.SWEEP_ROTATION)
        if len(rotation) == size:  # else the end of ACTIVE: the next slice starts from the oldest
            last, score = rotation[-1]
            pipe.hset(keys.SWEEP_ROTATION, mapping={"score": repr(score), "member": last})
        pipe.hset(keys.SWEEP_ROTATION, "size", next_size)
        pipe.execute()


def _repair_expiries(connection: Redis, job_ids: list[str]) -> None:
    """Every key of an ended job expires with its record (``jobs.core.retention``). A worker of
    an earlier release, a script that did not know a key, or a process that died between a
    job's end and its ``retain`` can leave one without an expiry (the payload copy, RQ's record:
    the submitted items, forever): each ended job is seen here once, as it leaves ACTIVE, and
    each of its keys gets at most the record's remaining time. One round trip for the batch."""
    retention.retain_many(connection, job_ids)


def _free_slots(connection: Redis, holders: list[tuple[RateLimitRegistry, str, bool]], rows: dict, now: float,
                counts: dict, requeued: list, seen: dict[str, list[str]]) -> None:
    """Of the jobs holding or waiting for an owner's slot that this round looked at: requeued
    failed jobs are replayed, and a slot held by a job that will not run (ended, deleted) is
    freed. A job this round failed was freed by it."""
    just_ended = set(seen["removed"]) | {entry.split(" ", 1)[0] for entry in seen["ended_by_rq"]}
    for registry, job_id, holds_slot in holders:
        if job_id in just_ended or job_id not in rows:
            continue
        state, ended_at, rq_status = rows[job_id]
        if requeued_by_rq(state, rq_status, ended_at, now):
            requeued.append(job_id)
        elif holds_slot and state in ENDED and rq_status not in ("queued", "started"):
            registry.release_stale_and_enqueue(job_id)
            if connection.zscore(registry.allowed_key, job_id) is None:
                counts["slots_freed"] += 1
                seen["slots_freed"].append(f"{job_id} ({state or 'gone'})")
