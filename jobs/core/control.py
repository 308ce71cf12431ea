"""Operator actions on one job: cancel."""

from __future__ import annotations

from redis import Redis
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.config import settings
from jobs.core import clock, retention, state_index
from jobs.core.lease import error_entry
from jobs.errors import CANCELED, NoSuchJob
from jobs.lifecycle import transitions
from jobs.usage.budget import batch_reservation
from jobs.usage.meter import utc_day

#: What ``cancel`` returns for a batch job that was waiting at its provider (ended at once).
WAITING = "waiting"


def cancel(connection: Redis, job_id: str, now: float | None = None, reason: str | None = None) -> str:
    """Cancel a job. Queued: failed at once with "canceled". Running: the next heartbeat
    stops it (failed, "canceled"); if it does not heartbeat within ``LEASH_CANCEL_GRACE``
    seconds the reaper sends RQ's stop command. A batch job waiting at its provider: failed at
    once (the caller then cancels its provider batch: ``jobs.batch.run.cancel_at_provider``).
    Terminal: nothing changes.
    Returns the state the job was in, or ``WAITING`` for a batch job that was waiting.
    ``reason``: its history entry's text (a job canceled because a job it waited for failed)."""
    now = clock.wall() if now is None else now
    s = settings()
    attempts, kind, before, owner, phase, reserved_day = connection.hmget(
        keys.job(job_id), "attempts", "kind", "state", "owner", "phase", "reserved_day")
    kind = (kind or b"").decode()
    if before == b"queued" or phase == b"waiting":
        # RQ's side first: should this process die between the two steps, the job is canceled
        # in RQ and still queued in leash, which the consistency sweep records as canceled; the
        # other order would leave a job failed in leash but queued in RQ, which reads as a requeue.
        _cancel_in_rq(connection, job_id)
    state = transitions.cancel(
        connection, job_id, (owner or b"").decode(), (reserved_day or b"").decode() or utc_day(now), kind, now,
        [job_id, now, now + s.cancel_grace, s.result_ttl,
         error_entry(int(attempts or 0), reason or CANCELED, now), f"canceled:{kind}", keys.STATS_MINUTE_TTL,
         *_batch_reservations(connection, job_id)],
    )
    state = state.decode() if isinstance(state, bytes) else state
    if state == "missing":
        raise NoSuchJob(f"no such job: {job_id}")
    if state == "waiting":
        if phase != b"waiting":
            _cancel_in_rq(connection, job_id)  # parked since we looked: RQ has it scheduled
        retention.retain(connection, job_id)  # ended: RQ's record too expires with it
        return WAITING  # the caller cancels its provider batch (jobs.batch.run.cancel_at_provider)
    if state == "queued" and before != b"queued":
        _cancel_in_rq(connection, job_id)  # it went back to the queue since we looked
    if state == "queued":
        # Ended: every key of it expires with its record, RQ's canceled record (which holds
        # the submitted items) and the history of an attempt that waited for a retry too.
        retention.retain(connection, job_id)
        state_index.trim_expired(connection, (owner or b"").decode(), now)  # its index may expire
    return state


def _batch_reservations(connection: Redis, job_id: str) -> list[str]:
    """The reservations of the job's provider batches (one per part it intended)."""
    names = [n.decode() for n in connection.hkeys(keys.provider_batches(job_id))]
    return [batch_reservation(job_id, int(n.split(":")[1])) for n in names if n.startswith("intent:")]


def _cancel_in_rq(connection: Redis, job_id: str) -> None:
    try:
        # RQ removes it from its queue or rate-limit wait set and frees its slot.
        Job.fetch(job_id, connection=connection, serializer=JSONSerializer).cancel()
    except (NoSuchJobError, InvalidJobOperation):
        pass
