"""Settings, read from the environment each time they are asked for (tests and workers
can change them per process). Every setting has a default that suits minutes-long AI jobs."""

from __future__ import annotations

import os
from dataclasses import dataclass


def _number(name: str, default, minimum, cast):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = cast(raw)
    except ValueError:
        kind = "an integer" if cast is int else "a number"
        raise ValueError(f"{name} must be {kind}, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def _int(name: str, default: int, minimum: int = 0) -> int:
    return _number(name, default, minimum, int)


def _float(name: str, default: float, minimum: float = 0.0) -> float:
    return _number(name, default, minimum, float)


def _int_list(name: str, default: list[int]) -> list[int]:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers, got {raw!r}") from None


WEEK = 7 * 24 * 3600


def _names(name: str, default: str) -> list[str]:
    raw = os.environ.get(name) or default
    names = [part.strip() for part in raw.split(",") if part.strip()]
    return names or [default]


@dataclass(frozen=True)
class Settings:
    #: every queue this deployment serves, first = highest priority for workers
    queues: list[str]
    lease_seconds: float
    max_attempts: int
    owner_concurrency: int
    result_ttl: int
    job_timeout: int
    retry_backoff: list[int]
    handoff_grace: float
    cancel_grace: float
    local_delay_ms: int
    error_max_chars: int
    max_defers: int
    item_concurrency: int

    @property
    def queue(self) -> str:
        """Where a job goes when the submitter names no queue: the first of LEASH_QUEUE."""
        return self.queues[0]


def settings() -> Settings:
    return Settings(
        queues=_names("LEASH_QUEUE", "leash"),
        lease_seconds=_float("LEASH_LEASE_SECONDS", 120.0, minimum=0.5),
        max_attempts=_int("LEASH_MAX_ATTEMPTS", 3, minimum=1),
        owner_concurrency=_int("LEASH_OWNER_CONCURRENCY", 2, minimum=1),
        result_ttl=_int("LEASH_RESULT_TTL", 6 * WEEK, minimum=60),
        # RQ's hard cap on one attempt. Hangs are caught by the lease long before this.
        job_timeout=_int("LEASH_JOB_TIMEOUT", 6 * 3600, minimum=1),
        retry_backoff=_int_list("LEASH_RETRY_BACKOFF", [10, 60, 300]),
        handoff_grace=_float("LEASH_HANDOFF_GRACE", 20.0, minimum=0.0),
        cancel_grace=_float("LEASH_CANCEL_GRACE", 10.0, minimum=0.0),
        local_delay_ms=_int("LEASH_LOCAL_DELAY_MS", 0),
        # Bytes of a stored error as JSON: head and tail of the traceback, small enough for the
        # job's hash (under 2 KB) and every status answer.
        error_max_chars=_int("LEASH_ERROR_MAX_CHARS", 1000, minimum=200),
        max_defers=_int("LEASH_MAX_DEFERS", 10, minimum=0),
        # Items of one attempt in flight at once (ctx.for_each); also the adaptive limit's ceiling.
        item_concurrency=_int("LEASH_ITEM_CONCURRENCY", 8, minimum=1),
    )


@dataclass(frozen=True)
class Limits:
    """What one job may ask for. Checked before anything is written; each rejection names
    its limit and the setting that raises it."""

    max_items: int
    max_item_chars: int
    max_labels: int
    max_label_chars: int
    max_template_chars: int
    max_payload_bytes: int
    max_payload_depth: int
    max_summary_bytes: int


def limits() -> Limits:
    return Limits(
        max_items=_int("LEASH_MAX_ITEMS", 1000, minimum=1),
        max_item_chars=_int("LEASH_MAX_ITEM_CHARS", 10_000, minimum=1),
        max_labels=_int("LEASH_MAX_LABELS", 20, minimum=1),
        max_label_chars=_int("LEASH_MAX_LABEL_CHARS", 40, minimum=1),
        max_template_chars=_int("LEASH_MAX_TEMPLATE_CHARS", 20_000, minimum=10),
        # The JSON payload as stored (compact, non-ASCII escaped); the HTTP body limit
        # (LEASH_MAX_BODY_BYTES) is checked first, before the body is even read.
        max_payload_bytes=_int("LEASH_MAX_PAYLOAD_BYTES", 1024 * 1024, minimum=1024),
        # Deep nesting costs stack in every JSON encoder on the way (RQ's included).
        max_payload_depth=_int("LEASH_MAX_PAYLOAD_DEPTH", 32, minimum=2),
        # A job's summary sits in its hash, read by every status poll: it must not grow with
        # the input (classify's counts per label are bounded by the label limits).
        max_summary_bytes=_int("LEASH_MAX_SUMMARY_BYTES", 1024, minimum=256),
    )
