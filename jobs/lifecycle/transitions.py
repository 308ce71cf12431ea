"""Every transition: the one module that runs the Lua scripts which change a job, one function
per script, each naming every key its script declares (``scripts.run`` checks them by name).

What counts as a transition: a script that changes a job -- writes its record (the job hash),
its other keys (items, errors, history, payload copy, batch record, usage) or their expiries,
or moves it in or out of the indexes of jobs (leases, the owner's state indexes and job list,
the failed and active indexes) or of RQ's queues and registries. The other scripts change no
job and are run from their own modules, keys passed by name too: room held before a call or a
submission (``door_take``, ``model_admit``, ``reservations_sweep``), shared limits
(``model_rate``, ``model_concurrency``), RQ's own records (``compact_finished_rq_job``,
``release_stale_lock``), a read that drops failed-index entries whose jobs are no longer
failed (``failure_heads``) and the request cache's entries the archive took (``cache_retire``).

Callers build ARGV (what the script is told); the keys are built here from the job's id, its
owner and queue. Every function returns the script's reply; ``pipeline`` queues it instead.
A function's script name is its transition's current version: a new version of a script is a
new file, and the function here moves to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis import Redis

from jobs import keys
from jobs.lifecycle import scripts

#: The names of the owner's state indexes in every KEYS line (keys.owner_state_indexes' order).
INDEX_NAMES = (*keys.INDEXED_STATES, "expiries")
#: The names of an ending's counters (keys.outcome_keys' order).
OUTCOME_NAMES = ("kind_minute", "all_minute", "totals")


def _indexes(owner: str) -> dict[str, str]:
    return dict(zip(INDEX_NAMES, keys.owner_state_indexes(owner), strict=True))


def _outcome(outcome: str, kind: str, now: float) -> dict[str, str]:
    return dict(zip(OUTCOME_NAMES, keys.outcome_keys(outcome, kind, now), strict=True))


def _fenced(job_id: str) -> dict[str, str]:
    """What every write of an attempt holding the lease names: the job, the leases, and the
    counter of writes refused to attempts that lost theirs."""
    return {"job": keys.job(job_id), "leases": keys.LEASES, "rejected_writes": keys.REJECTED_WRITES}


def _ended(job_id: str) -> dict[str, str]:
    """The job's keys an ending gives the record's expiry."""
    return {"items": keys.items(job_id), "errors": keys.errors(job_id), "payload": keys.payload(job_id)}


def claim(connection: Redis, job_id: str, owner: str, args: list) -> Any:
    """queued -> running: a new attempt and its lease (or a look at a waiting batch)."""
    return scripts.run(connection, "claim_v4", {
        "job": keys.job(job_id), "leases": keys.LEASES, "history": keys.history(job_id), **_indexes(owner)}, args)


def item_keys(connection: Redis, job_id: str, queue: str) -> dict[str, str]:
    """The keys of an attempt's item writes (heartbeat, store_items) but its usage's and the
    cache's: built once per attempt, as the item write is the hot path."""
    return {**_fenced(job_id), "items": keys.items(job_id), "rq_job": keys.rq_job(job_id),
            "rq_started": keys.rq_started(queue, connection)}


def heartbeat(connection: Redis, item_keys: Mapping[str, str], usage_keys: Mapping[str, str],
              cache_keys: Mapping[str, Any], args: list) -> Any:
    """Renew the lease; progress, an item's result, its usage and cache entries (fenced)."""
    return scripts.run(connection, "heartbeat_v4", {**item_keys, **usage_keys, **cache_keys}, args)


def store_items(connection: Redis, item_keys: Mapping[str, str], usage_keys: Mapping[str, str],
                cache_keys: Mapping[str, Any], args: list) -> Any:
    """Many items' results, their usage and cache entries, in one fenced write."""
    return scripts.run(connection, "store_items_v2", {**item_keys, **usage_keys, **cache_keys}, args)


def usage_record(connection: Redis, job_id: str, usage_keys: Mapping[str, str], args: list) -> Any:
    """Usage with no item to ride on, and answers kept for the next attempt (not fenced)."""
    return scripts.run(connection, "usage_record_v3", {
        "job": keys.job(job_id), **usage_keys, "received_answers": keys.received_answers(job_id)}, args)


def batch_usage_record(connection: Redis, job_id: str, owner: str, day: str, model: str, args: list) -> Any:
    """The usage of a canceled job's provider batch, counted once it is read (not fenced); no
    answers are kept for a next attempt (``usage_record_v3``'s last argument, '')."""
    return scripts.run(connection, "usage_record_v3", {
        "job": keys.job(job_id), "usage": keys.usage(job_id), "owner_day": keys.usage_owner_day(owner, day),
        "model_usage": keys.usage_model(model), "reservations": keys.owner_reservations(owner),
        "reservation_records": keys.owner_reservation_records(owner),
        "received_answers": keys.received_answers(job_id)}, [*args, ""])


def settle_abandoned(connection: Redis, job_id: str, owner: str, args: list) -> Any:
    """Before an ending: the job's direct calls whose reservations still stand (an earlier
    work-horse's, killed with calls in flight) are counted as estimated calls."""
    return scripts.run(connection, "reservations_settle_v1", {
        "job": keys.job(job_id), "reservations": keys.owner_reservations(owner),
        "reservation_records": keys.owner_reservation_records(owner)},
        args)


def finish(connection: Redis, job_id: str, owner: str, kind: str, now: float, args: list) -> Any:
    """running -> succeeded (fenced)."""
    return scripts.run(connection, "finish_v3", {
        **_fenced(job_id), **_ended(job_id), **_outcome("succeeded", kind, now), **_indexes(owner)}, args)


def fail(connection: Redis, job_id: str, owner: str, outcome: str, kind: str, now: float, args: list) -> Any:
    """running -> queued for another attempt, or failed (fenced); ``outcome``: failed or canceled."""
    return scripts.run(connection, "fail_v2", {
        **_fenced(job_id), **_ended(job_id), **_outcome(outcome, kind, now), "failed_index": keys.FAILED_INDEX,
        **_indexes(owner)}, args)


def _rq_running(connection: Redis, job_id: str, queue: str) -> dict[str, str]:
    """RQ's side of a running job: its record, its queue, started and executions registries."""
    return {"rq_job": keys.rq_job(job_id), "rq_queue": keys.rq_queue(queue),
            "rq_started": keys.rq_started(queue, connection), "rq_executions": keys.rq_executions(job_id, connection)}


def release(connection: Redis, job_id: str, owner: str, queue: str, args: list) -> Any:
    """running -> queued without counting the attempt: handed off or deferred (fenced)."""
    return scripts.run(connection, "release_v3", {
        **_fenced(job_id), **_rq_running(connection, job_id, queue), "history": keys.history(job_id),
        **_indexes(owner)}, args)


def park(connection: Redis, job_id: str, args: list) -> Any:
    """A batch job stays running, waiting at its provider, with no worker (fenced)."""
    return scripts.run(connection, "park_v1", {**_fenced(job_id), "batch_looks": keys.BATCH_LOOKS}, args)


def batch_note(connection: Redis, job_id: str, record: str, args: list) -> Any:
    """Fields of the job's batch record (or of its hash: ``record``), written under the lease."""
    return scripts.run(connection, "batch_note_v1", {
        "job": keys.job(job_id), "record": record, "rejected_writes": keys.REJECTED_WRITES}, args)


def reclaim(connection: Redis, job_id: str, owner: str, queue: str, kind: str, now: float, args: list) -> Any:
    """running -> queued or failed: a lease that expired, or an attempt known dead."""
    return scripts.run(connection, "reclaim_v2", {
        "job": keys.job(job_id), "leases": keys.LEASES, **_rq_running(connection, job_id, queue),
        "rq_failed": keys.rq_failed(queue, connection), "reclaims": keys.RECLAIMS, **_ended(job_id),
        **_outcome("failed", kind, now), "failed_index": keys.FAILED_INDEX, **_indexes(owner)}, args)


def cancel(connection: Redis, job_id: str, owner: str, day: str, kind: str, now: float, args: list) -> Any:
    """queued or waiting -> failed (canceled); running: asked to stop. ``day``: the day of the
    reservation the release before may have left in the job hash."""
    return scripts.run(connection, "cancel_v3", {
        "job": keys.job(job_id), "cancels": keys.CANCELS, **_ended(job_id), **_outcome("canceled", kind, now),
        "failed_index": keys.FAILED_INDEX, **_indexes(owner), "leases": keys.LEASES,
        "owner_day": keys.usage_owner_day(owner, day), "reservations": keys.owner_reservations(owner),
        "reservation_records": keys.owner_reservation_records(owner)}, args)


def end_outside(connection: Redis, job_id: str, owner: str, outcome: str, kind: str, now: float,
                args: list) -> Any:
    """queued -> failed (or canceled): RQ's own tools ended the job."""
    return scripts.run(connection, "end_outside_v2", {
        "job": keys.job(job_id), **_ended(job_id), "failed_index": keys.FAILED_INDEX, "active": keys.ACTIVE,
        **_outcome(outcome, kind, now), **_indexes(owner)}, args)


def replay(connection: Redis, per_job: list[str], args: list) -> Any:
    """failed -> queued for a batch of jobs; ``per_job``: each job's block of keys (replay_v4's
    header), in ARGV's order."""
    return scripts.run(connection, "replay_v4", {
        "failed_index": keys.FAILED_INDEX, "active": keys.ACTIVE, "per_job": per_job}, args)


def requeue_swallowed(connection: Redis, job_id: str, queue: str, args: list) -> Any:
    """A queued job (or a waiting batch job's look) a dead worker took off its queue and never
    claimed goes back on it."""
    return scripts.run(connection, "requeue_swallowed_v2", {
        "job": keys.job(job_id), "rq_job": keys.rq_job(job_id),
        "rq_intermediate": keys.rq_intermediate(queue, connection), "rq_queue": keys.rq_queue(queue)}, args)


def index_job(connection: Redis, job_id: str, owner: str, args: list, pipeline=None) -> Any:
    """The job into the state index of its state (a job written before the indexes existed)."""
    return scripts.run(connection, "index_job_v1", {"job": keys.job(job_id), **_indexes(owner)}, args,
                       pipeline=pipeline)


def owner_index_expiry(connection: Redis, owner: str, args: list, pipeline=None) -> Any:
    """Drop the owner's index entries of expired jobs; the owner's job list expires with them."""
    return scripts.run(connection, "owner_index_expiry_v1", {
        "owner_jobs": keys.owner_jobs(owner), **_indexes(owner), "state_index_ready": keys.STATE_INDEX_READY},
        args, pipeline=pipeline)


def retain(connection: Redis, job_id: str, args: list, pipeline=None) -> Any:
    """Every key of an ended job, leash's and RQ's, expires no later than its record."""
    return scripts.run(connection, "retain_v1", {
        "job": keys.job(job_id), "retained": keys.retained_with_job(job_id, connection)}, args, pipeline=pipeline)


def archived(connection: Redis, job_id: str, args: list) -> Any:
    """A job the archive holds whole: its heavy keys leave Redis after the keep time."""
    return scripts.run(connection, "archived_v1", {
        "job": keys.job(job_id), "heavy": keys.archived_heavy(job_id, connection)}, args)


def restore_record(connection: Redis, job_id: str, owner: str, args: list) -> Any:
    """An ended job's record, history and estimate back from the archive, in its owner's indexes
    (once Redis lost them: for a replay)."""
    return scripts.run(connection, "restore_record_v1", {
        "job": keys.job(job_id), "errors": keys.errors(job_id), "history": keys.history(job_id),
        "estimate": keys.estimate(job_id), "failed_index": keys.FAILED_INDEX, "owner_jobs": keys.owner_jobs(owner),
        **_indexes(owner)}, args)


def webhook(connection: Redis, job_id: str, args: list, pipeline=None) -> Any:
    """A job's completion webhook begun for one ending, or one delivery attempt recorded (jobs/webhooks/)."""
    return scripts.run(connection, "webhook_v1", {"job": keys.job(job_id)}, args, pipeline=pipeline)
