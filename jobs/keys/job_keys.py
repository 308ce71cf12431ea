"""The keys of one job: its record, items, errors, history, payload copy, usage, price, provider
batches; and its idempotency key. ``PREFIX`` is where every leash key lives."""

from __future__ import annotations

PREFIX = "leash:"


def job(job_id: str) -> str:
    """The small job hash: state, attempts, progress, lease, error, result summary."""
    return f"{PREFIX}job:{job_id}"


def items(job_id: str) -> str:
    """Hash of per-item results (index -> JSON), the checkpoint; never read by a status poll."""
    return f"{PREFIX}items:{job_id}"


def errors(job_id: str) -> str:
    """List of this job's error history, one JSON entry per failed or lost attempt."""
    return f"{PREFIX}errors:{job_id}"


def history(job_id: str) -> str:
    """List of this job's attempts as they started (attempt, at, worker) and, for those given
    back without an error, how they ended (attempt, at, ended: handed off | deferred)."""
    return f"{PREFIX}history:{job_id}"

IDEMPOTENCY_PREFIX = PREFIX + "idem:"
#: Every idempotency key, of this release's form and the previous one's (jobs/core/store/schema.py).
IDEMPOTENCY_PATTERN = IDEMPOTENCY_PREFIX + "*"


def idempotency(owner: str, key: str) -> str:
    """The job id an owner's idempotency key points at. The owner's length comes first, so
    owner "team" + key "ops:k1" and owner "team:ops" + key "k1" are different keys."""
    return f"{IDEMPOTENCY_PREFIX}{len(owner)}:{owner}:{key}"


def legacy_idempotency(owner: str, key: str) -> str:
    """The idempotency key as releases before the owner's length was added wrote it. Still
    read (and only honoured for a job of the same owner: this form is ambiguous), so a client
    retrying across an upgrade finds its job instead of paying for it twice."""
    return f"{IDEMPOTENCY_PREFIX}{owner}:{key}"


def payload(job_id: str) -> str:
    """The payload as submitted (JSON), from which a replay rebuilds RQ's side of a deleted job. Expires
    with the job, or LEASH_RESULT_TTL after its submission or replay at the latest (0.2 does not)."""
    return f"{PREFIX}payload:{job_id}"


def effect(job_id: str, name: str) -> str:
    """Marker that a side effect ran for this job (see jobs.core.running.effects.once)."""
    return f"{PREFIX}effect:{job_id}:{name}"

#: Every job hash matches this pattern (the one-time indexing SCANs it).
JOB_PATTERN = PREFIX + "job:*"


def usage(job_id: str) -> str:
    """Hash of one job's usage by attempt ("a<n>:<field>") and by item ("i<index>": calls,
    input and output tokens); the job's totals live in its own hash (status reads them)."""
    return f"{PREFIX}usage:job:{job_id}"


def estimate(job_id: str) -> str:
    """The job's price as estimated at submission (JSON), shown beside what it spent."""
    return f"{PREFIX}estimate:{job_id}"


def received_answers(job_id: str) -> str:
    """Hash of answers an attempt received but could not store with their items, by request
    digest: paid for, so the next attempt uses them instead of asking again."""
    return f"{PREFIX}answers:job:{job_id}"


def provider_batches(job_id: str) -> str:
    """Hash of a batch job's provider batches: each part's intent (before the create call) and
    id (after it), which parts were read to their end, when the first was created."""
    return f"{PREFIX}batches:{job_id}"


def ended_job_keys(job_id: str) -> list[str]:
    """leash's keys of one job that expire with its record once it has ended (but the record)."""
    return [payload(job_id), items(job_id), errors(job_id), history(job_id), usage(job_id), provider_batches(job_id),
            received_answers(job_id), estimate(job_id)]
