"""Every Redis key leash reads or writes, in one place.

leash's own keys live under ``leash:``; RQ's keys are taken from RQ's own objects
(``Job.key_for``, registry ``.key``) so a change in RQ's naming cannot split the two.
Lua scripts never build key names: callers pass them in KEYS.
"""

from __future__ import annotations

import fnmatch

from rq import registry as rq_registry
from rq.executions import ExecutionRegistry
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.queue import Queue
from rq.rate_limit import RateLimitRegistry
from rq.results import Result
from rq.scheduler import RQScheduler
from rq.worker import Worker

PREFIX = "leash:"

#: Sorted set of running job ids scored by lease expiry (unix seconds); the reaper's index.
LEASES = PREFIX + "leases"
#: Sorted set of job ids whose cancel was requested, scored by when the hard stop is due.
CANCELS = PREFIX + "cancels"
#: Counter of writes refused because they came from a superseded attempt (zombies).
REJECTED_WRITES = PREFIX + "stats:rejected_writes"
#: Counter of leases reclaimed after they expired.
RECLAIMS = PREFIX + "stats:reclaims"
#: Sorted set of failed job ids scored by when they failed: the dead-letter index.
FAILED_INDEX = PREFIX + "failed"
#: Hash of all-time outcome counts, field "<outcome>:<kind>".
STATS_TOTALS = PREFIX + "stats:totals"
#: How long per-minute outcome counters live.
STATS_MINUTE_TTL = 2 * 24 * 3600
#: Sorted set of job ids enqueued and not yet seen ended, scored by creation time: what the
#: consistency sweep checks against RQ's side (jobs deleted or failed by RQ's own tools).
ACTIVE = PREFIX + "active"
#: Where the consistency sweep resumes in ACTIVE (a rank), when one round did not cover it all.
#: Written by releases before the rotation below; read by none now.
SWEEP_CURSOR = PREFIX + "active:cursor"
#: Hash: where the sweep's slow rotation through ACTIVE resumes (fields "score" and "member",
#: the last job it checked: a position that removals before it cannot shift) and how many
#: jobs its next slice checks ("size").
SWEEP_ROTATION = PREFIX + "sweep:rotation"
#: Hash of what the sweep last saw of each RQ queue's lists and registries (field: the queue's
#: key, value: their lengths): a tick where nothing changed reads no job.
SWEEP_QUEUES_SEEN = PREFIX + "sweep:queues"
#: Hash of each owner's last balance between leash's queued and running jobs and the jobs RQ
#: holds for the owner (field: the owner): only an owner whose balance moved is compared.
SWEEP_OWNERS_SEEN = PREFIX + "sweep:owners"
#: Sorted set of batch jobs parked at their provider (park_v1), by when their next look is overdue:
#: the sweep reads only those past it, correcting entries whose job moved on (jobs/core/lost_looks.py).
BATCH_LOOKS = PREFIX + "batch:looks"
#: Written (and expiring at once) by the web app's readiness check: does Redis take writes?
READY_PROBE = PREFIX + "ready:probe"
#: Throttle key so that, of many workers, one reaps per interval.
REAPER_THROTTLE = PREFIX + "reaper:throttle"
#: Stream of replay audit entries (who, when, selector, ids), capped at REPLAY_AUDIT_MAXLEN.
REPLAY_AUDIT = PREFIX + "audit:replays"
REPLAY_AUDIT_MAXLEN = 1000
#: The archive (jobs/archive/): ended jobs to write to SQL (sorted set: job id -> when first noted),
#: what its last writes met (hash: ok_at, error, error_at), and the throttle of its sweep.
ARCHIVE_DUE, ARCHIVE_STATUS, ARCHIVE_THROTTLE = (PREFIX + "archive:" + n for n in ("due", "status", "throttle"))
#: Completion webhooks (jobs/webhooks/): jobs that may have ended (job id -> when noted), the sweep's throttle.
WEBHOOKS_DUE, WEBHOOKS_THROTTLE = (PREFIX + "webhooks:" + n for n in ("due", "throttle"))
PAUSED, QUIET = PREFIX + "paused", PREFIX + "quiet"  # hashes: queue / worker -> since (jobs/core/switches.py)
WAITING_BUDGET, WAITING_PROVIDER = PREFIX + "waiting:budget", PREFIX + "waiting:provider"  # jobs/core/deferrals.py
#: Hash (at, peer, path; expires): the last request that came without X-Forwarded-For while every
#: peer is trusted as a proxy (LEASH_TRUSTED_PROXIES=*): web/proxy_check.py writes it, leash doctor reads it.
DIRECT_REQUEST = PREFIX + "web:direct_request"


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


def stats_minute(outcome: str, kind: str, minute: int) -> str:
    """Count of jobs that ended in ``outcome`` during one minute (unix time // 60); kind "_all": all."""
    return f"{PREFIX}stats:{outcome}:{kind}:{minute}"


def outcome_keys(outcome: str, kind: str, now: float) -> list[str]:
    """KEYS a terminal transition passes to Lua: this minute's counters (kind, all), totals."""
    minute = int(now // 60)
    return [stats_minute(outcome, kind, minute), stats_minute(outcome, "_all", minute), STATS_TOTALS]

IDEMPOTENCY_PREFIX = PREFIX + "idem:"
#: Every idempotency key, of this release's form and the previous one's (jobs/core/schema.py).
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
    """Marker that a side effect ran for this job (see jobs.core.effects.once)."""
    return f"{PREFIX}effect:{job_id}:{name}"


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


def owner_jobs(owner: str) -> str:
    """Sorted set of an owner's job ids by creation time (for listings)."""
    return f"{PREFIX}owner:{owner}:jobs"

#: Every owner's job index (the state indexes' backfill gives each its expiry when it ends).
OWNER_JOBS_PATTERN = owner_jobs("*")


def owner_of_jobs_key(key: str) -> str:
    """The owner whose job index ``key`` is (the inverse of ``owner_jobs``)."""
    return key[len(owner_jobs("")) - len(":jobs"):-len(":jobs")]

#: The states an owner's jobs are indexed by, in the order ``owner_state_indexes`` gives
#: their keys (the Lua scripts rely on that order).
INDEXED_STATES = ("queued", "running", "succeeded", "failed")


def owner_state(owner: str, state: str) -> str:
    """Sorted set of an owner's job ids in one leash state, by creation time; the Lua transitions
    keep each job in exactly the index of its state (jobs/lua/_lib.lua, index_state)."""
    return f"{PREFIX}owner:{owner}:state:{state}"


def owner_expiries(owner: str) -> str:
    """Sorted set of an owner's ended job ids scored by when their records expire: the ended
    entries of the state indexes leave with their jobs (jobs/read/listing.py trims the due ones)."""
    return f"{PREFIX}owner:{owner}:expiries"


def owner_door_holds(owner: str) -> str:
    """Sorted set of the places an owner's submissions and replays took in the queued cap and have
    not yet written, by job id, scored by when each lapses (jobs/intake/door.py)."""
    return f"{PREFIX}owner:{owner}:door"


def owner_state_indexes(owner: str) -> list[str]:
    """The KEYS block a state-changing script takes: the state indexes, then the expiries."""
    return [owner_state(owner, state) for state in INDEXED_STATES] + [owner_expiries(owner)]

#: Set once every job written before the state indexes existed has been indexed
#: (jobs/core/state_index.py); until then a state filter reads the jobs themselves.
STATE_INDEX_READY = PREFIX + "schema:state_index"
#: Hash of the data layout this Redis holds: ``version`` (the schema written last), ``compatible_from``
#: (the oldest schema whose code may still run against it), ``release`` (which wrote it), ``at``.
SCHEMA = PREFIX + "schema"
#: Held (a few seconds, renewed) by the one process migrating the schema.
SCHEMA_LOCK = PREFIX + "schema:lock"
#: Where the one-time indexing resumes (a SCAN cursor), between reaper ticks.
STATE_INDEX_CURSOR = PREFIX + "schema:state_index:cursor"
#: Every job hash matches this pattern (the one-time indexing SCANs it).
JOB_PATTERN = PREFIX + "job:*"
#: Prefix of the submission-rate counters (kept by the ``limits`` package, jobs/intake/admission.py).
SUBMIT_RATE_PREFIX = PREFIX + "submit_rate"
#: Prefix of the counters of failed sign-ins, tokens and dashboard passwords (web/guessing.py).
GUESS_RATE_PREFIX = PREFIX + "guess_rate"


def guess_rate_scope(door: str, by: str, value: str) -> tuple[str, ...]:
    """The identifiers of one counter of failed guesses: at a door (signin, token, dashboard),
    by client address or by the failing guess (a keyed digest of it)."""
    return ("guess", door, by, value)


def browser_session(session_id: str) -> str:
    """A signed-in browser's session (value: its owner), kept for the cookie's lifetime and
    deleted at sign-out: a copy of the cookie is worth nothing once it is gone."""
    return f"{PREFIX}session:{session_id}"


def rate_scope(counter: str, *values: str) -> tuple[str, ...]:
    """A counter under SUBMIT_RATE_PREFIX: ``("submit", owner)``, ``("dry-run", "owner"|"address", value)``."""
    return (counter, *values)


def rq_job(job_id: str) -> str:
    return Job.key_for(job_id)


def rq_queue(queue_name: str) -> str:
    return Queue.redis_queue_namespace_prefix + queue_name


def rq_started(queue_name: str, connection) -> str:
    return rq_registry.StartedJobRegistry(queue_name, connection=connection).key


def rq_failed(queue_name: str, connection) -> str:
    return rq_registry.FailedJobRegistry(queue_name, connection=connection).key


def rq_finished(queue_name: str, connection) -> str:
    return rq_registry.FinishedJobRegistry(queue_name, connection=connection).key


def rq_scheduled(queue_name: str, connection) -> str:
    return rq_registry.ScheduledJobRegistry(queue_name, connection=connection).key


def rq_canceled(queue_name: str, connection) -> str:
    return rq_registry.CanceledJobRegistry(queue_name, connection=connection).key


def rq_intermediate(queue_name: str, connection) -> str:
    """RQ's list of jobs a worker took off the queue and has not yet started."""
    return IntermediateQueue(rq_queue(queue_name), connection).key


def rq_executions(job_id: str, connection) -> str:
    return ExecutionRegistry(job_id, connection=connection).key


def rq_queues_set() -> str:
    """RQ's set of known queue keys (rq-dashboard and ``rq info`` list queues from it)."""
    return Queue.redis_queues_keys


def rq_workers() -> str:
    """RQ's set of registered workers' keys (a worker's own key expires when it stops beating)."""
    return Worker.redis_workers_keys


def owner_rate_limit_key(owner: str) -> str:
    """The RQ ``RateLimit`` key that holds an owner's concurrency slots."""
    return f"leash-owner:{owner}"


def rq_rate_limit(rate_limit_key: str, connection) -> RateLimitRegistry:
    """RQ's registry for one rate-limit key; its ``allowed_key`` holds the jobs using a slot,
    its ``rate_limited_key`` the jobs waiting for one."""
    return RateLimitRegistry(rate_limit_key, connection=connection)


def rq_scheduler_lock(queue_name: str) -> str:
    """RQ's lock naming the scheduler that moves this queue's due retries."""
    return RQScheduler.get_locking_key(queue_name)


def ended_job_keys(job_id: str) -> list[str]:
    """leash's keys of one job that expire with its record once it has ended (but the record)."""
    return [payload(job_id), items(job_id), errors(job_id), history(job_id), usage(job_id), provider_batches(job_id),
            received_answers(job_id), estimate(job_id)]


def rq_results(job_id: str) -> str:
    """RQ's stream of a job's results (each attempt's outcome and traceback)."""
    return Result.get_key(job_id)


def retained_with_job(job_id: str, connection) -> list[str]:
    """Every key of one job, leash's and RQ's, that expires no later than its record once it
    has ended (jobs/core/retention.py): RQ's record holds the submitted items."""
    return ended_job_keys(job_id) + [rq_job(job_id), rq_results(job_id), rq_executions(job_id, connection)]


def archived_heavy(job_id: str, connection) -> list[str]:
    """What an archived job lets go after LEASH_REDIS_KEEP: all but its record, errors, history, estimate."""
    return [payload(job_id), items(job_id), usage(job_id), provider_batches(job_id), received_answers(job_id),
            rq_job(job_id), rq_results(job_id), rq_executions(job_id, connection)]


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


def usage_owner_day(owner: str, day: str) -> str:
    """Hash of an owner's usage during one UTC day (YYYY-MM-DD): totals, "by|<model>|<kind>|
    <field>", and the reservations of calls in flight (the daily budget's check)."""
    return f"{PREFIX}usage:owner:{len(owner)}:{owner}:{day}"


def owner_reservations(owner: str) -> str:
    """Sorted set of an owner's budget reservations (model calls and provider batches that may
    still be paid for), each by the time after which it can no longer be (its deadline):
    admission gives back the ones past it (model_admit_v3)."""
    return f"{PREFIX}reservations:{len(owner)}:{owner}"


def owner_reservation_records(owner: str) -> str:
    """Hash of an owner's reservations by id: what each holds (tokens, nano-USD), the job hash
    and the owner's day hash it is held in, and that UTC day (its usage is counted there)."""
    return f"{PREFIX}reservations:{len(owner)}:{owner}:records"


def reservation_owners() -> str:
    """Sorted set of the owners holding budget reservations, by their earliest deadline
    (reservations_sweep_v1 counts abandoned calls of owners who make no more)."""
    return f"{PREFIX}reservations:owners"


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


def usage_model(model: str) -> str:
    """Hash of one model's all-time usage and cost (``/metrics``)."""
    return f"{PREFIX}usage:model:{model}"


#: The keys kept without an expiry on purpose, as ``fnmatch`` patterns: indexes and counters
#: that outlive any one job (their entries leave with their jobs), per-model records, and the
#: schema markers. Every other ``leash:`` key carries a TTL once its job has ended, an owner's
#: indexes once the owner has no queued or running job (docs/OPERATIONS.md, "Upgrading"; the
#: upgrade test checks it). A queued or running job's keys have none until it ends (but its
#: payload copy, which expires LEASH_RESULT_TTL after submission at the latest).
PERMANENT = (
    LEASES, CANCELS, FAILED_INDEX, ACTIVE, BATCH_LOOKS, SWEEP_CURSOR, SWEEP_ROTATION, SWEEP_QUEUES_SEEN,
    SWEEP_OWNERS_SEEN, REJECTED_WRITES, RECLAIMS, STATS_TOTALS, REPLAY_AUDIT, MODELS, model_concurrency("*"),
    usage_model("*"), reservation_owners(), STATE_INDEX_READY, SCHEMA, CACHE_INDEX, CACHE_SIZES, CACHE_BYTES,
    WEBHOOKS_DUE, PAUSED, QUIET, WAITING_BUDGET, WAITING_PROVIDER,
)


def is_permanent(key: str) -> bool:
    """Whether ``key`` is one of PERMANENT (kept without an expiry on purpose)."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in PERMANENT)


def provider_batches(job_id: str) -> str:
    """Hash of a batch job's provider batches: each part's intent (before the create call) and
    id (after it), which parts were read to their end, when the first was created."""
    return f"{PREFIX}batches:{job_id}"
