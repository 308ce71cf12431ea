"""Every setting, read in one place: the only module that reads the environment.

Each variable is declared once in jobs/config/declarations.py with its type, default, lower bound
and meaning (the tables of docs/SETTINGS.md list exactly these; tests/test_codebase.py keeps the
two in step and fails if another module reads ``os.environ`` or a variable by name). Code reads
them through the typed groups at the end (``settings().lease_seconds``; the web app's and the
command line's in jobs/config/front.py), read afresh each time they are asked for (tests and
workers can change them per process); a bad value is a ValueError naming the variable. Every
default suits minutes-long AI jobs. Nothing here imports the rest of leash: every layer may read
settings."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Any

from jobs.config.declarations import DECLARED, Setting, declare  # noqa: F401 (read as config.DECLARED, ...)


def raw(name: str) -> str | None:
    """The variable as set (None when unset or empty). Only declared names may be read."""
    if name not in DECLARED:
        raise KeyError(f"{name} is not a declared setting (jobs/config/declarations.py)")
    published = _overlay.get()
    value = published[name] if published is not None and name in published else os.environ.get(name)
    return value if value not in (None, "") else None


#: Settings read in place of the environment, within ``overlay``.
_overlay: ContextVar[dict[str, str | None] | None] = ContextVar("leash_settings_overlay", default=None)


@contextmanager
def overlay(values: dict[str, str | None]) -> Iterator[None]:
    """Within it (this thread or task only), the settings named in ``values`` read those (None:
    unset) instead of the environment: the model settings a queue's workers published, while a
    job is priced (jobs/intake/deployed_model.py)."""
    token = _overlay.set(dict(values))
    try:
        yield
    finally:
        _overlay.reset(token)


def get(name: str) -> Any:
    """The parsed value of a declared setting, or its default; a bad value is a ValueError naming it."""
    setting = DECLARED[name]
    text = raw(name)
    if text is None:
        return setting.default
    text = text.strip()
    try:
        if setting.type == "int":
            value = int(text)
        elif setting.type == "float":
            value = float(text)
        elif setting.type == "bool":
            if text.lower() not in ("0", "1", "true", "false", "yes", "no"):
                raise ValueError
            return text.lower() in ("1", "true", "yes")
        elif setting.type == "ints":
            return [int(part) for part in text.split(",") if part.strip()] or setting.default
        elif setting.type == "names":
            return [part.strip() for part in text.split(",") if part.strip()] or setting.default
        else:
            if setting.type == "rate":  # a bad rate fails at start, not at the first submission
                __import__("limits").parse_many(text)
            return text
    except ValueError:
        expected = {"int": "an integer", "float": "a number", "bool": "0 or 1", "ints": "comma-separated integers",
                    "rate": "a rate like 60/minute (or several: 10/second;1000/day)"}[setting.type]
        raise ValueError(f"{name} must be {expected}, got {text!r}") from None
    if setting.minimum is not None and value < setting.minimum:
        raise ValueError(f"{name} must be at least {setting.minimum:g}, got {value}")
    return value


def check_all() -> None:
    """Parse every declared setting once: a bad value fails at start, not in the middle of a job."""
    for name in DECLARED:
        get(name)


def environ() -> dict[str, str]:
    """A copy of the environment for a child process (``leash dev``'s web app and workers)."""
    return dict(os.environ)


def export(name: str, value: str) -> None:
    """Set a declared variable for this process and the ones it starts."""
    DECLARED[name]  # noqa: B018 - only declared names
    os.environ[name] = value



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
    reduce_chunk_tokens: int
    usage_hold_seconds: float
    usage_days_kept: int
    imports: str

    @property
    def queue(self) -> str:
        """Where a job goes when the submitter names no queue: the first of LEASH_QUEUE."""
        return self.queues[0]


def _read(snapshot: type, renamed: dict[str, str] | None = None):
    """``snapshot`` filled from the variables its fields name: ``max_items`` is LEASH_MAX_ITEMS."""
    names = renamed or {}
    return snapshot(**{f.name: get(names.get(f.name, "LEASH_" + f.name.upper())) for f in fields(snapshot)})


def settings() -> Settings:
    return _read(Settings, {"queues": "LEASH_QUEUE"})


@dataclass(frozen=True)
class Limits:
    """What one job may ask for, checked before anything is written; a rejection names its limit and setting."""

    max_items: int
    max_item_chars: int
    max_labels: int
    max_label_chars: int
    max_template_chars: int
    max_payload_bytes: int
    max_payload_depth: int
    max_summary_bytes: int
    max_csv_columns: int
    max_schema_bytes: int
    max_schema_depth: int
    max_schema_properties: int
    max_schema_expansion: int
    schema_check_seconds: float


def limits() -> Limits:
    return _read(Limits)


@dataclass(frozen=True)
class RedisSettings:
    #: as set: its form is checked where connections are made (jobs.core.store.connection.configured_url)
    redis_url: str | None
    redis_timeout: float


def redis_settings() -> RedisSettings:
    return _read(RedisSettings, {"redis_url": "REDIS_URL"})


@dataclass(frozen=True)
class ModelCalls:
    """What every model backend is called with (jobs/models/), and the prices of its answers."""

    model_backend: str | None
    model_url: str | None
    model_name: str | None
    model_api_key: str | None
    model_timeout: float
    model_rpm: float
    model_tpm: float
    model_max_inline_wait: float
    model_temperature: float | None
    model_max_tokens: int
    model_structured_output: str
    repair_attempts: int
    model_prices: str | None


def model_calls() -> ModelCalls:
    return _read(ModelCalls)


@dataclass(frozen=True)
class Batches:
    """How a job sent as a provider batch waits for it."""

    batch_poll_seconds: float
    batch_poll_max: float
    batch_max_wait: float
    batch_cancel_grace: float
    batch_fallback: str


def batches() -> Batches:
    return _read(Batches)


@dataclass(frozen=True)
class Budgets:
    owner_daily_tokens: int
    owner_daily_usd: float


def budgets() -> Budgets:
    return _read(Budgets)


@dataclass(frozen=True)
class AnswerCache:
    #: as set (`on`/`off`, ...) : jobs.models.cache says what each spelling means
    cache: str
    cache_scope: str
    cache_days: float
    cache_max_mb: float


def answer_cache() -> AnswerCache:
    return _read(AnswerCache)


@dataclass(frozen=True)
class Logs:
    log_level: str
    log_format: str
    log_http_calls: bool
    sentry_dsn: str | None


def logs() -> Logs:
    return _read(Logs, {"sentry_dsn": "SENTRY_DSN"})

