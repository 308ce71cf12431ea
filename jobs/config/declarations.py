"""Every setting leash reads, declared once: its variable, type, default, lower bound and meaning.

A new setting is one ``declare(...)`` line here, a field of the typed group that reads it
(jobs/config/__init__.py for jobs/, jobs/config/front.py for the web app and the command line, or
the group of its area: quotas.py, stores.py, ...) and its row in docs/SETTINGS.md (the tests compare
the tables with these declarations). Reading the environment is jobs/config/__init__.py's alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One environment variable; ``documented`` is False for facts leash reads but does not own (``USER``)."""

    name: str
    type: str  # str | int | float | bool | ints | names (a,b) | rate (60/minute) | redis_url (text here)
    default: Any
    meaning: str
    minimum: float | None = None
    documented: bool = True


DECLARED: dict[str, Setting] = {}


def declare(name: str, type: str, default: Any, meaning: str, minimum: float | None = None,
            documented: bool = True) -> None:
    DECLARED[name] = Setting(name, type, default, meaning, minimum, documented)



WEEK = 7 * 24 * 3600
# --- the lifecycle ---------------------------------------------------------------------------
declare("REDIS_URL", "redis_url", None, "Redis (`rediss://` works with Heroku's self-signed certificates; "
        "`redis+sentinel://host:26379,.../<service>[/db]` behind Sentinel)")
declare("LEASH_QUEUE", "names", ["leash"], "the queues served, comma-separated; jobs go to the first unless named")
# 20 s: a dead worker's job runs again within lease + a reaper tick + a claim, under 30 s; renewed
# every third of it, so two renewals in a row can miss (docs/BENCHMARKS.md).
declare("LEASH_LEASE_SECONDS", "float", 20.0, "lease length; a job must heartbeat within it", 0.5)
declare("LEASH_MAX_ATTEMPTS", "int", 3, "default attempts per job", 1)
declare("LEASH_RETRY_BACKOFF", "ints", [10, 60, 300], "seconds before the 2nd attempt, the 3rd, then every later one")
declare("LEASH_OWNER_CONCURRENCY", "int", 2, "queued-or-running jobs per owner", 1)
declare("LEASH_RESULT_TTL", "int", 6 * WEEK, "how long results and failures are kept (seconds)", 60)
declare("LEASH_ARCHIVE_URL", "str", None, "where ended jobs are archived: an SQLAlchemy URL (`sqlite:///...`, ...)")
declare("DATABASE_URL", "str", None, "the platform's database: the archive when LEASH_ARCHIVE_URL is unset")
declare("LEASH_REDIS_KEEP", "int", 3600, "seconds an archived job's items, answers and usage stay in Redis", 0)
declare("LEASH_JOB_TIMEOUT", "int", 6 * 3600, "RQ's hard cap on one attempt (seconds)", 1)
declare("LEASH_HANDOFF_GRACE", "float", 20.0, "seconds a job gets to hand off on SIGTERM", 0.0)
declare("LEASH_USAGE_HOLD_SECONDS", "float", 900.0,
        "how long an ending attempt keeps trying to write the usage of answers it received", 0.0)
declare("LEASH_CANCEL_GRACE", "float", 10.0, "seconds before a cancel falls back to RQ's stop command", 0.0)
declare("LEASH_MAX_DEFERS", "int", 10, "`RetryLater` deferrals before they count as failures", 0)
declare("LEASH_PROVIDER_OUTAGE_MAX", "float", 3600.0, "seconds a job waits for a provider failing every call", 0.0)
declare("LEASH_USAGE_DAYS_KEPT", "int", 400, "UTC days Redis keeps each owner's daily usage", 1)
declare("LEASH_ACCESS_LOG", "str", "auto", "a JSON line per request: `auto` (on in production), `1`, `0`")
declare("LEASH_ITEM_CONCURRENCY", "int", 8,
        "items of one job in flight at once; the ceiling of each model's adaptive limit", 1)
declare("LEASH_REDUCE_CHUNK_TOKENS", "int", 3000,
        "a reduce job's texts per call, in estimated tokens: more are reduced in chunks, then the partials", 100)
declare("LEASH_LOCAL_DELAY_MS", "int", 0, "per-item latency of the offline backend", 0)
declare("LEASH_ERROR_MAX_CHARS", "int", 1000, "a stored error's length, in bytes as JSON", 200)
declare("LEASH_IMPORTS", "str", "", "modules that register job kinds (comma-separated)")
declare("LEASH_MAX_ITEM_ERRORS", "str", None, "item errors a job may end with and succeed: `3` or `10%`")
declare("LEASH_WEBHOOK_URL", "str", None, "where a job's completion webhook goes when it names none (docs/WEBHOOKS.md)")
declare("LEASH_WEBHOOK_SECRET", "str", None, "signs webhooks: `whsec_` + base64 (Standard Webhooks), or any text as is")
declare("LEASH_WEBHOOK_ALLOW_PRIVATE", "bool", False, "`1`: webhooks may go to private and loopback addresses")
declare("LEASH_WEBHOOK_BACKOFF", "ints", [10, 60, 300, 900, 1800] + [3600] * 24, "seconds before each webhook retry")

# --- the worker process (also `leash worker` options) -----------------------------------------
declare("LEASH_BURST", "bool", False, "`leash worker`: quit when the queues are empty")
declare("LEASH_WORKER_NAME", "str", None, "`leash worker`: the worker's name (default: random)")
declare("LEASH_WITH_SCHEDULER", "bool", True, "`leash worker`: run RQ's retry scheduler in this worker")
declare("LEASH_LOG_LEVEL", "str", "INFO", "`leash worker`: log level")
declare("LEASH_LOG_FORMAT", "str", "text", "`text` or `json` (one JSON object per log line)")
declare("LEASH_LOG_HTTP_CALLS", "bool", False, "`1`: the HTTP clients' line per model call (httpx, openai, anthropic)")
declare("SENTRY_DSN", "str", None, "report failed attempts and web errors to Sentry (`leash[sentry]`)")

# --- limits: what one job may ask for ----------------------------------------------------------
declare("LEASH_MAX_ITEMS", "int", 1000, "items per job", 1)
declare("LEASH_MAX_ITEM_CHARS", "int", 10_000, "characters per item (one taken from another job's results too)", 1)
declare("LEASH_MAX_LABELS", "int", 20, "labels of a `classify` job", 1)
declare("LEASH_MAX_LABEL_CHARS", "int", 40, "characters per label", 1)
declare("LEASH_MAX_TEMPLATE_CHARS", "int", 20_000, "characters of a `prompt` template", 10)
# The JSON payload as stored (compact); LEASH_MAX_BODY_BYTES is checked first, before it is read.
declare("LEASH_MAX_PAYLOAD_BYTES", "int", 1024 * 1024, "the whole payload, as JSON", 1024)
# Deep nesting costs stack in every JSON encoder on the way (RQ's included).
declare("LEASH_MAX_PAYLOAD_DEPTH", "int", 32, "how deeply lists and objects nest in the payload", 2)
# A job's summary sits in its hash, read by every status poll: it must not grow with the input.
declare("LEASH_MAX_SUMMARY_BYTES", "int", 1024, "a job's summary as JSON", 256)
# Picking a CSV upload's text column reads every cell once: one odd row must not make every row count.
declare("LEASH_MAX_CSV_COLUMNS", "int", 1000, "columns of an uploaded CSV file", 1)
# An `extract` job's JSON Schema: every answer is validated against it, and providers cap it.
declare("LEASH_MAX_SCHEMA_BYTES", "int", 16_384, "an `extract` schema, as JSON", 64)
declare("LEASH_MAX_SCHEMA_DEPTH", "int", 12, "how deeply an `extract` schema's lists and objects nest", 2)
declare("LEASH_MAX_SCHEMA_PROPERTIES", "int", 100, "properties declared in an `extract` schema, all levels", 1)
declare("LEASH_MAX_SCHEMA_EXPANSION", "int", 2000, "subschemas an `extract` schema reaches, its `$ref`s followed", 10)
declare("LEASH_SCHEMA_CHECK_SECONDS", "float", 2.0, "time a worker spends checking one `extract` answer", 0.01)

# --- model calls -------------------------------------------------------------------------------
# Every backend shares these; a backend is chosen by name (jobs/models/backends.py lists them).
declare("LEASH_MODEL_BACKEND", "str", None,
        "the model backend: `local`, `openai` or `anthropic` (default: `openai` if LEASH_MODEL_URL is set)")
declare("LEASH_MODEL_URL", "str", None, "the model server's base URL (default: the backend's provider)")
declare("LEASH_MODEL_NAME", "str", None, "the model to call (required by every backend but `local`)")
declare("LEASH_MODEL_API_KEY", "str", None, "the provider's API key, sent as `Authorization: Bearer ...`")
declare("LEASH_MODEL_TIMEOUT", "float", 60.0, "seconds one call may take", 0.1)
declare("LEASH_MODEL_RPM", "float", 0.0, "requests per minute, shared by every worker (0: no limit)", 0.0)
declare("LEASH_MODEL_TPM", "float", 0.0, "tokens per minute, shared by every worker (0: no limit)", 0.0)
declare("LEASH_MODEL_MAX_INLINE_WAIT", "float", 30.0, "the longest `Retry-After` a job waits out in place", 0.0)
declare("LEASH_MODEL_TEMPERATURE", "float", None, "sampling temperature (default: the server's)", 0.0)
declare("LEASH_MODEL_MAX_TOKENS", "int", 1024, "tokens one answer may take", 1)
declare("LEASH_MODEL_STRUCTURED_OUTPUT", "str", "schema",
        "`extract` answers: `schema` (the provider enforces it), `json` (JSON mode) or `prompt` (schema in the prompt)")
declare("LEASH_REPAIR_ATTEMPTS", "int", 2, "times an `extract` answer that breaks its schema is asked again", 0)
declare("LEASH_BATCH_POLL_SECONDS", "float", 60.0, "seconds between a waiting batch job's looks at its provider", 0.1)
declare("LEASH_BATCH_POLL_MAX", "float", 900.0, "the longest gap between looks at a batch that has waited long", 0.1)
declare("LEASH_BATCH_MAX_WAIT", "float", 86400.0, "seconds a batch job may wait; then the rest run direct", 1)
declare("LEASH_BATCH_CANCEL_GRACE", "float", 600.0, "seconds a canceled batch may take to end; then direct", 0)
declare("LEASH_BATCH_FALLBACK", "str", "direct", "requests a batch did not answer: `direct` (asked again) or `fail`")

# --- cost: usage, prices, budgets ---------------------------------------------------------------
declare("LEASH_MODEL_PRICES", "str", None,
        'JSON `{"<model>": {"input": USD per 1M tokens, "output": ...}}`; other models: the genai-prices table')
declare("LEASH_OWNER_DAILY_TOKENS", "int", 0, "tokens an owner's jobs may use per UTC day (0: no limit)", 0)
declare("LEASH_OWNER_DAILY_USD", "float", 0.0, "USD an owner's jobs may spend per UTC day (0: no limit)", 0.0)
declare("LEASH_CACHE", "str", "on", "`on`: a request already answered is answered from the cache; `off`: never")
declare("LEASH_CACHE_SCOPE", "str", "owner", "whose answers a request may reuse: `owner` (its own), `shared` (any)")
declare("LEASH_CACHE_DAYS", "float", 30.0, "days a cached answer is kept after its last use", 0.001)
declare("LEASH_CACHE_MAX_MB", "float", 256.0,
        "the cache's size cap in MB; the least recently used answers go first", 0.0)

# --- the web app -------------------------------------------------------------------------------
declare("SECRET_KEY", "str", None, "signs browser sessions; required outside `leash dev`")
declare("LEASH_SECRET_KEY", "str", None,
        "deprecated: SECRET_KEY's old name, read when SECRET_KEY is unset (the web app logs a line saying so)")
declare("LEASH_API_TOKENS", "str", "", "`owner=token,...`; unset: an open API (development only)")
declare("LEASH_DASHBOARD_USER", "str", None, "rq-dashboard at /rq: basic-auth user")
declare("LEASH_DASHBOARD_PASSWORD", "str", None, "rq-dashboard at /rq: basic-auth password")
declare("LEASH_MAX_BODY_BYTES", "int", 1024 * 1024, "request body limit", 1)
declare("LEASH_MAX_SESSIONS", "int", 20,
        "signed-in browser sessions per owner; signing in past it signs the oldest out", 1)
declare("LEASH_SECURE_COOKIES", "bool", False, "`1`: cookies only over HTTPS")
declare("LEASH_REDIS_TIMEOUT", "float", 5.0,
        "seconds before an unanswered Redis call is given up: a 503 in the web app, exit 1 from a command", 0.01)
declare("LEASH_METRICS_TOKEN", "str", None, "bearer token /metrics requires")
declare("LEASH_METRICS_PUBLIC", "bool", False, "`1`: /metrics open to anyone in production (without a token)")
# Sign-in and quotas (jobs/intake/admission.py, web/auth.py); they matter once LEASH_API_TOKENS is set.
declare("LEASH_TRUSTED_USER_HEADER", "str", None,
        "a header naming the signed-in owner, set by an auth proxy that strips it from clients (default: off)")
declare("LEASH_PUBLIC_SUBMIT", "bool", False, "`1`: visitors who are not signed in may use the form, as owner `public`")
declare("LEASH_MAX_QUEUED_PER_OWNER", "int", 1000, "an owner's queued jobs; a submission beyond is a 429", 1)
declare("LEASH_GUESS_RATE", "rate", "10/minute;100/hour",
        "failed sign-ins, tokens, dashboard passwords per client address and per token prefix")
declare("LEASH_TRUSTED_PROXIES", "str", None,
        "`leash web`: `*` or the proxy's address: read the client address from its X-Forwarded-For")
declare("LEASH_SUBMIT_RATE", "rate", None, "an owner's submissions per period, e.g. `60/minute` (default: none)")
declare("LEASH_DRY_RUN_RATE", "rate", "30/minute;300/hour", "dry runs and estimates per owner, and per address")
# A thread works on a whole request (read first), mostly waiting on Redis (LEASH_REDIS_TIMEOUT at most).
declare("LEASH_WEB_THREADS", "int", 16, "`leash web`: threads answering requests", 1)
# Each connection costs a socket and at most its buffered request, never a thread.
declare("LEASH_WEB_CONNECTIONS", "int", 0,
        "`leash web`: connections held at once, slow ones included (0: as many as the open-file limit allows)", 0)
declare("LEASH_WEB_CONNECTIONS_PER_ADDRESS", "int", 100,
        "`leash web`: connections one client address may hold (not behind LEASH_TRUSTED_PROXIES; 0: no cap)", 0)
declare("LEASH_WEB_REQUEST_DEADLINE", "float", 30.0,
        "`leash web`: seconds from a request's first byte to its last (headers and body)", 1.0)
declare("PORT", "int", 5000, "the web app's port (`leash web`, the Procfile; `leash dev --port`)", 1)
declare("LEASH_DEV", "bool", False,
        "set by `leash dev`: development defaults (a per-run secret, /rq without a password)")
declare("PROMETHEUS_MULTIPROC_DIR", "str", None,
        "where several web processes would share request metrics (unset: one process counts its own)")

# --- the command line --------------------------------------------------------------------------
declare("LEASH_OWNER", "str", None, "the owner `leash submit` / `leash jobs` act as")
declare("LEASH_TOKEN", "str", None, "an API token the CLI acts with (its owner)")
declare("LEASH_WEB_URL", "str", None, "the web app's address `leash submit` prints (default: `leash dev`'s)")
declare("LEASH_DEV_WORKERS", "int", 1, "`leash dev`: how many workers", 1)
declare("LEASH_ACTOR", "str", None, "who `leash replay` records as the actor (default: $USER)")
declare("LEASH_ALERT_WINDOW", "str", "1h", "`leash alert --window`")
declare("LEASH_ALERT_MAX_FAILURES", "int", None, "`leash alert --max-failures`", 0)
declare("LEASH_ALERT_MAX_RATIO", "float", None, "`leash alert --max-ratio`", 0.0)
declare("LEASH_ALERT_WEBHOOK", "str", None, "`leash alert --webhook`")
declare("LEASH_ALERT_INCLUDE_CANCELED", "bool", False, "`leash alert --include-canceled`")

# --- facts of the environment leash reads but does not own -------------------------------------
declare("USER", "str", "unknown", "the operator (the default replay actor)", documented=False)
declare("XDG_STATE_HOME", "str", None, "where `leash dev` records its addresses", documented=False)
