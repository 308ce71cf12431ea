"""Every Redis key leash reads or writes, in one package: the only code that names keys.

leash's own keys live under ``leash:``; RQ's keys are taken from RQ's own objects
(``Job.key_for``, registry ``.key``) so a change in RQ's naming cannot split the two.
Lua scripts never build key names: callers pass them in KEYS.

Each module owns an area, and every name is read from here (``keys.job(job_id)``,
``keys.LEASES``): one job's keys (job_keys.py), the deployment's shared indexes, counters and
schema markers (shared_keys.py), an owner's (owner_keys.py), model calls' and the request cache's
(model_keys.py), a pipeline's (pipeline_keys.py), RQ's (rq_keys.py). A key kept without an expiry
joins ``PERMANENT`` below.
"""

from __future__ import annotations

import fnmatch

from jobs.keys import model_keys, owner_keys, shared_keys
from jobs.keys.job_keys import *  # noqa: F403
from jobs.keys.model_keys import *  # noqa: F403
from jobs.keys.owner_keys import *  # noqa: F403
from jobs.keys.pipeline_keys import *  # noqa: F403
from jobs.keys.rq_keys import *  # noqa: F403
from jobs.keys.shared_keys import *  # noqa: F403

#: The keys kept without an expiry on purpose, as ``fnmatch`` patterns: indexes and counters
#: that outlive any one job (their entries leave with their jobs), per-model records, and the
#: schema markers. Every other ``leash:`` key carries a TTL once its job has ended, an owner's
#: indexes once the owner has no queued or running job (docs/OPERATIONS.md, "Upgrading"; the
#: upgrade test checks it). A queued or running job's keys have none until it ends (but its
#: payload copy, which expires LEASH_RESULT_TTL after submission at the latest).
PERMANENT = (
    shared_keys.LEASES, shared_keys.CANCELS, shared_keys.FAILED_INDEX, shared_keys.ACTIVE, shared_keys.BATCH_LOOKS,
    shared_keys.SWEEP_CURSOR, shared_keys.SWEEP_ROTATION, shared_keys.SWEEP_QUEUES_SEEN, shared_keys.SWEEP_OWNERS_SEEN,
    shared_keys.REJECTED_WRITES, shared_keys.RECLAIMS, shared_keys.STATS_TOTALS, shared_keys.REPLAY_AUDIT,
    model_keys.MODELS, model_keys.model_concurrency("*"), model_keys.usage_model("*"), owner_keys.reservation_owners(),
    shared_keys.STATE_INDEX_READY, shared_keys.SCHEMA, model_keys.CACHE_INDEX, model_keys.CACHE_SIZES,
    model_keys.CACHE_BYTES, shared_keys.WEBHOOKS_DUE, shared_keys.PAUSED, shared_keys.QUIET,
    shared_keys.WAITING_BUDGET, shared_keys.WAITING_PROVIDER, shared_keys.OPERATOR_AUDIT, shared_keys.REAPER_REFUSALS,
    owner_keys.SESSION_OWNERS,
)


def is_permanent(key: str) -> bool:
    """Whether ``key`` is one of PERMANENT (kept without an expiry on purpose)."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in PERMANENT)
