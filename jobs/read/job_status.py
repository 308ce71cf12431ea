"""A job's status by its id, wherever it is kept: Redis while it holds the job's record, else the
SQL archive, which keeps every ended job whole (docs/ARCHIVE.md).

Redis can lose a record the archive still holds: a Redis without persistence restarted, a
failover to an empty replica, FLUSHALL, a record whose own expiry came first. The job's address
then answers as it did, from the record, error and attempt history it archived, through the same
builder (``states.from_raw``): the same state, outcome, progress, error, attempts, usage and cost,
with ``source: "archive"``. The normal path is unchanged: the archive is read only when Redis has
no record, in one query. Its webhook is read where its attempts went on being written, the
archive's ``leash_webhook_deliveries`` (a delivery usually ends after the job was archived).

Actions that need the job live in Redis refuse one that is only in the archive (``ONLY_ARCHIVED``);
a replay puts its record back first (jobs/archive/restore.py)."""

from __future__ import annotations

from typing import Any

from redis import Redis

from jobs.archive import reading, webhook_log
from jobs.config.webhook_settings import webhooks
from jobs.core import states
from jobs.core.details import whole_error as whole_error_of
from jobs.core.text import decoded
from jobs.errors import NoSuchJob
from jobs.read import job_view
from jobs.webhooks.delivery import LOG_KEPT
from jobs.webhooks.ending import delivery_id

#: What a page, the API and the command line say of a status read from the archive.
ARCHIVE_NOTE = "read from the archive: Redis no longer holds this job"
#: Why an action that needs the job in Redis (cancel, look now) is refused for such a job.
ONLY_ARCHIVED = "this job is only in the archive (Redis no longer holds it): it has ended"


def from_archive(fields: dict[str, Any]) -> bool:
    """Whether these status fields were read from the archive."""
    return fields.get("source") == states.FROM_ARCHIVE


def status(connection: Redis, job_id: str, now: float | None = None, whole_error: bool = False) -> dict[str, Any]:
    """``states.status`` (``leash status``, ``leash watch``, whoever owns the job), or the archive's
    when Redis has no record of it; ``NoSuchJob`` when neither holds it."""
    try:
        return states.status(connection, job_id, now=now, whole_error=whole_error)
    except NoSuchJob:
        found = reading.ended_job(job_id, connection)
        if found is None:
            raise
        return archived_fields(connection, found, now=now, whole_error=whole_error)


def owned(connection: Redis, job_id: str, owner: str, now: float | None = None) -> dict[str, Any]:
    """The status fields of the owner's job as its address answers them (``GET /jobs/<id>``),
    every attempt of its webhook too: one Redis round trip (two while it waits for a retry), or
    one query of the archive when Redis has no record. ``NoSuchJob`` for an unknown id and for
    another owner's job alike, archived or not."""
    raw, rq_status, errors, history = states.read_with_history(connection, job_id)
    if not raw:
        return archived_fields(connection, owned_in_archive(connection, job_id, owner), now=now, every_attempt=True)
    if decoded(raw.get(b"owner")) != owner:
        raise NoSuchJob(f"no such job: {job_id}")
    fields = states.from_raw(job_id, raw, rq_status, now=now, errors=errors, history=history,
                             retry_at=states.retry_time(connection, job_id, raw, rq_status))
    return job_view.with_every_webhook_attempt(connection, job_id, fields)


def owned_in_archive(connection: Redis, job_id: str, owner: str) -> reading.EndedJob:
    """The owner's job as the archive keeps it; ``NoSuchJob`` when it does not hold it, or holds
    another owner's (the same answer, so an id says nothing about whose it is)."""
    found = reading.ended_job(job_id, connection)
    if found is None or found.owner != owner:
        raise NoSuchJob(f"no such job: {job_id}")
    return found


def archived_fields(connection: Redis, found: reading.EndedJob, now: float | None = None,
                    whole_error: bool = False, every_attempt: bool = False) -> dict[str, Any]:
    """The status fields of an archived job, as Redis gave them from the same record. No RQ
    status: an ended job's does not change what its status says. ``every_attempt``: all of its
    webhook's attempts (as the job's address shows them), else the last few its record kept."""
    fields = states.from_raw(found.job_id, found.record, None, now=now, errors=found.errors, history=found.history)
    if whole_error:
        fields["error"] = whole_error_of(found.errors, fields["error"])
    fields["source"] = states.FROM_ARCHIVE
    _webhook_since_archived(connection, found, fields, every_attempt)
    return fields


def _webhook_since_archived(connection: Redis, found: reading.EndedJob, fields: dict[str, Any],
                            every_attempt: bool) -> None:
    """The webhook as its attempts went: the archived record holds those made before the job was
    archived (often none: both follow the job's end within seconds), the archive's deliveries
    every one. Its state is the delivery's: delivered once an attempt was taken, given up once
    the last of its attempts failed, else pending."""
    hook = fields.get("webhook")
    ended_at = found.record.get("ended_at")
    if not hook or not ended_at:
        return
    hook_id = hook.get("id") or delivery_id(found.job_id, ended_at)
    kept = webhook_log.read(reading.engine_for(connection), found.job_id, hook_id)
    if not kept:
        return
    if len(kept) > int(hook.get("attempts") or 0):  # attempts made after the job was archived
        last = kept[-1]
        state = "delivered" if last["error"] is None else "given up" if last["attempt"] >= webhooks().attempts \
            else "pending"
        hook.update(id=hook_id, state=state, attempts=len(kept))
    hook["deliveries"] = kept if every_attempt else kept[-LOG_KEPT:]
