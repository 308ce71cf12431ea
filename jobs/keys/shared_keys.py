"""The deployment's own keys, shared by every job: the indexes the reaper and the sweeps read,
the outcome counters, the schema markers, the switches (paused queues, quiet workers) and the
throttles of the sweeps."""

from __future__ import annotations

from jobs.keys.job_keys import PREFIX

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
#: the sweep reads only those past it, correcting entries whose job moved on (jobs/core/upkeep/lost_looks.py).
BATCH_LOOKS = PREFIX + "batch:looks"
#: Written (and expiring at once) by the web app's readiness check: does Redis take writes?
READY_PROBE = PREFIX + "ready:probe"
#: Throttle key so that, of many workers, one reaps per interval.
REAPER_THROTTLE = PREFIX + "reaper:throttle"
#: Hash: how many writes Redis had refused for memory (INFO errorstats) at the reaper's last
#: round, and when (jobs/core/upkeep/reaper.py: leases that ran out while Redis was full get a grace).
REAPER_REFUSALS = PREFIX + "reaper:refusals"
#: Stream of replay audit entries (who, when, selector, ids), capped at REPLAY_AUDIT_MAXLEN.
REPLAY_AUDIT = PREFIX + "audit:replays"
REPLAY_AUDIT_MAXLEN = 1000
#: Stream of the operator's switches thrown (who, when, pause/resume/quiet, of what), capped.
OPERATOR_AUDIT = PREFIX + "audit:operator"
OPERATOR_AUDIT_MAXLEN = 1000
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


def stats_minute(outcome: str, kind: str, minute: int) -> str:
    """Count of jobs that ended in ``outcome`` during one minute (unix time // 60); kind "_all": all."""
    return f"{PREFIX}stats:{outcome}:{kind}:{minute}"


def outcome_keys(outcome: str, kind: str, now: float) -> list[str]:
    """KEYS a terminal transition passes to Lua: this minute's counters (kind, all), totals."""
    minute = int(now // 60)
    return [stats_minute(outcome, kind, minute), stats_minute(outcome, "_all", minute), STATS_TOTALS]


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
