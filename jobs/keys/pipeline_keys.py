"""The keys of a pipeline: a named group of stage jobs submitted in one request
(jobs/intake/pipelines.py). Each stage is an ordinary job with its own keys (job_keys.py); the
pipeline's record says which jobs its stages are."""

from __future__ import annotations

from jobs.keys.job_keys import PREFIX


def pipeline(pipeline_id: str) -> str:
    """Hash of one pipeline: owner, name, created_at, its stages (JSON: name, kind, job id), its
    budget and webhook. Expires LEASH_RESULT_TTL after it was submitted, as its stages' records do
    at the latest once they end."""
    return f"{PREFIX}pipeline:{pipeline_id}"


def pipeline_idempotency(owner: str, key: str) -> str:
    """The pipeline an owner's idempotency key points at (its stages' jobs have keys of their own)."""
    return f"{PREFIX}idem-pipeline:{len(owner)}:{owner}:{key}"


def pipeline_webhook(pipeline_id: str) -> str:
    """The ending of its stages the pipeline's webhook was last queued for (sent once per ending)."""
    return f"{PREFIX}pipeline-webhook:{pipeline_id}"


def owner_pipelines(owner: str) -> str:
    """Sorted set of an owner's pipelines by submission time (``GET /pipelines``, ``leash pipeline
    list``); expires LEASH_RESULT_TTL after the owner's last pipeline, as its records do."""
    return f"{PREFIX}pipelines:{len(owner)}:{owner}"
