"""The keys of model calls shared across jobs: each model's rate limit, adaptive concurrency and
all-time usage, and the request cache."""

from __future__ import annotations

from jobs.keys.job_keys import PREFIX


def model_rate(scope: str, bucket: str) -> str:
    """The shared rate limit of every worker calling one model (``scope``): "requests" and "tokens"
    hold the next free time (ms), "paused" the end of a 429's wait (jobs/lua/model_rate_v1.lua)."""
    return f"{PREFIX}model_rate:{scope}:{bucket}"


def model_concurrency(scope: str) -> str:
    """Hash of the adaptive concurrency limit shared by every job calling one model: limit, epoch, clean
    answers since the last change, the last overload's level, answers, 429s, timeouts (its Lua script)."""
    return f"{PREFIX}model_concurrency:{scope}"

#: Set of model names that have an adaptive concurrency hash (what /metrics reports on).
MODELS = PREFIX + "models"


def cache_entry(scope: str, digest: str) -> str:
    """One answer of the request cache (a string with an expiry; jobs/models/cache.py)."""
    return f"{PREFIX}cache:{scope}:{digest}"


def cache_scope(owner: str | None) -> str:
    """Whose answers an entry is: one owner's (LEASH_CACHE_SCOPE=owner), or everyone's (None)."""
    return "shared" if owner is None else f"o:{len(owner)}:{owner}"


#: The request cache's entries by last use (sorted set of their key names), each entry's size
#: in bytes (hash), and the sum of the sizes (a counter): the cache's cap is leash's own.
CACHE_INDEX = PREFIX + "cache-index"
CACHE_SIZES = PREFIX + "cache-sizes"
CACHE_BYTES = PREFIX + "cache-bytes"


def model_settings(queue: str) -> str:
    """The model settings the workers of ``queue`` run with, as the last of them published them
    (a string of JSON with an expiry; jobs/intake/deployed_model.py): what prices a job."""
    return f"{PREFIX}model_settings:{queue}"


def usage_model(model: str) -> str:
    """Hash of one model's all-time usage and cost (``/metrics``)."""
    return f"{PREFIX}usage:model:{model}"
