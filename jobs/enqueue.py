"""Putting a job on the queue: validate first, write second.

A job is a kind, a JSON payload, an owner and ``max_attempts``. Its RQ job carries a
``RateLimit`` per owner (jobs beyond the owner's concurrency wait as ``rate_limited``, never
rejected) and a ``Retry`` whose intervals give the backoff between failed attempts. RQ
forbids ``unique`` with ``rate_limit``, so the idempotency key is leash's own key.
"""

from __future__ import annotations

import json
import re
import sys
import types
from typing import NamedTuple

from redis import Redis
from redis.exceptions import NoScriptError, WatchError
from rq import Queue
from rq.job import JobStatus
from rq.rate_limit import RateLimitRegistry

from jobs import keys, kinds
from jobs.config import Settings, settings
from jobs.core import clock, parents, payload_copy
from jobs.core.rq_side import new_job_id, rq_job_for, rq_queue
from jobs.errors import InvalidJob
from jobs.intake import door, modes
from jobs.intake.limits import check_cache_option, check_payload
from jobs.models import backends
from jobs.read import selection
from jobs.usage import budget
from jobs.webhooks.requested import url_for_job

_SAFE = re.compile(r"^[A-Za-z0-9_.:@-]{1,200}$")


def resolve_queue(queue: str | None, served: list[str] | None = None) -> str:
    """The queue a job goes to: one the deployment serves (LEASH_QUEUE), the first by default."""
    served = served or settings().queues
    if queue is None or queue == "":
        return served[0]
    if not isinstance(queue, str) or queue not in served:
        raise InvalidJob(f"queue must be one of the queues this deployment serves (LEASH_QUEUE): "
                         f"{', '.join(served)}; got {json.dumps(queue)[:80]}")
    return queue


def wait_for_slot(q: Queue, job, pipe, score: float) -> RateLimitRegistry:
    """RQ's rate-limited enqueue (save as rate_limited, join the owner's waiting set, promote
    while slots are free), on our pipeline and with a sub-second ``score``: RQ scores the
    waiting set in whole seconds and promotes ties in job-id order, which would start an
    owner's jobs of one second in random order instead of the order they were submitted."""
    job.redis_server_version = q.get_redis_server_version()
    job.origin = q.name
    registry = RateLimitRegistry.from_job(job)
    job._status = JobStatus.RATE_LIMITED
    registry.register(job.rate_limit_concurrency, pipe)
    job.save(pipeline=pipe)
    job.cleanup(ttl=job.ttl, pipeline=pipe)
    registry.add_to_rate_limited(job.id, pipe, timestamp=score)
    registry.acquire_and_enqueue(job.rate_limit_concurrency, pipeline=pipe)
    return registry


def _execute_without_script_check(pipe, registry: RateLimitRegistry | None, concurrency: int) -> None:
    """Run the enqueue's transaction in one round trip. A pipeline that carries a Lua script
    first asks Redis whether the script is loaded (SCRIPT EXISTS: a second round trip on every
    enqueue); here the promotion script's EVALSHA goes without asking. Only after Redis lost
    its script cache (a restart) does it answer NOSCRIPT: the rest of the transaction is
    applied all the same (the job is saved and waits for its owner's slot), and the promotion
    runs at once on its own, loading the script: it only fills free slots, so running it
    apart is as good as inside."""
    pipe.scripts.clear()
    results = pipe.execute(raise_on_error=False)
    errors = [r for r in results if isinstance(r, Exception)]
    if errors and registry is not None and all(isinstance(e, NoScriptError) for e in errors):
        registry.acquire_and_enqueue(concurrency)
    elif errors:
        raise errors[0]


#: A job's name: what people call it in the list ("March reviews"), searchable; not unique.
NAME_CHARS = 100


def check_name(name) -> str | None:
    """The name stripped, or None for none; InvalidJob unless it is one line of text."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise InvalidJob(f"'name' must be a string of at most {NAME_CHARS} characters")
    name = name.strip()
    if len(name) > NAME_CHARS:
        raise InvalidJob(f"'name' is {len(name)} characters long; at most {NAME_CHARS}")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InvalidJob("'name' must be one line of text, without control characters")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in name):  # a lone surrogate: UTF-8 cannot carry it
        raise InvalidJob("'name' is not valid Unicode (a lone surrogate)")
    return name or None


def _is_key(value) -> bool:
    """An owner or idempotency key of the allowed form (letters, digits and _.:@-)."""
    return isinstance(value, str) and bool(_SAFE.match(value))


def _validate(kind: str, payload, owner: str, max_attempts: int, idempotency_key: str | None) -> int:
    if not isinstance(kind, str):
        raise InvalidJob("'kind' must be a string")
    definition = kinds.get(kind)
    check_payload(payload)  # an object, within LEASH_MAX_PAYLOAD_BYTES and _DEPTH
    if not _is_key(owner):
        raise InvalidJob("owner must be 1-200 characters of letters, digits and _.:@-")
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or not 1 <= max_attempts <= 100:
        raise InvalidJob("max_attempts must be an integer from 1 to 100")
    if idempotency_key is not None and not _is_key(idempotency_key):
        raise InvalidJob("idempotency key must be 1-200 characters of letters, digits and _.:@-")
    budget.parse(payload.get(budget.BUDGET_FIELD))
    check_cache_option(payload)
    total = definition.validate(payload)
    modes.check_mode(payload, kind, definition.batch, backends.batch_problem)
    return total


class Checked(NamedTuple):
    """A submission that passed every check ``enqueue`` makes: what ``write`` puts on the queue."""

    kind: str
    payload: dict
    owner: str
    max_attempts: int
    total: int  # the number of items, as the kind's validator counted them
    name: str | None
    queue: str  # one the deployment serves
    idempotency_key: str | None = None
    webhook_url: str | None = None  # where its completion webhook goes (jobs/webhooks/)
    after: tuple[str, ...] = ()  # the jobs it waits for (jobs/core/parents.py)
    after_policy: str = "cancel"  # if one of them does not succeed
    pipeline: str | None = None  # the pipeline it is a stage of (jobs/intake/pipelines.py)


def check(kind: str, payload, owner: str = "default", max_attempts: int | None = None, queue: str | None = None,
          name: str | None = None, idempotency_key: str | None = None, webhook_url: str | None = None,
          after=None, after_policy: str | None = None, pipeline: str | None = None) -> Checked:
    """Every check ``enqueue`` makes of a submission, once, writing nothing (InvalidJob).
    ``webhook_url``: the job's own, else LEASH_WEBHOOK_URL's (jobs/webhooks/requested.py);
    ``after``, ``after_policy``: the jobs it waits for and what if one fails (jobs/core/parents.py)."""
    s = settings()
    max_attempts = s.max_attempts if max_attempts is None else max_attempts
    chosen = selection.parse(payload.get(selection.FIELD)) if isinstance(payload, dict) else None
    if chosen is not None and "items" in payload:
        raise InvalidJob("give 'items' or 'items_from', not both")
    # Items taken from another job's results are read as the job starts (jobs/read/selection.py):
    # the rest is checked here with a stand-in item, and the job waits for that job.
    # One character: within any LEASH_MAX_ITEM_CHARS (at least 1), so no limit refuses the stand-in.
    checked = {**payload, "items": ["x"]} if chosen is not None else payload
    total = _validate(kind, checked, owner, max_attempts, idempotency_key)
    if chosen is not None:
        total = 0  # its items are counted as it starts
    policy_given = after_policy not in (None, "")
    after, after_policy = parents.parse(after, after_policy)
    if chosen is not None and chosen["job"] not in after:
        after = [*after, chosen["job"]]
    if policy_given and not after:  # it would say what to do about jobs it does not wait for
        raise InvalidJob(parents.POLICY_WITHOUT_AFTER)
    return Checked(kind, payload, owner, max_attempts, total, check_name(name), resolve_queue(queue, s.queues),
                   idempotency_key, url_for_job(webhook_url), tuple(after), after_policy, pipeline)


def validate(kind: str, payload, owner: str = "default", max_attempts: int | None = None, queue: str | None = None,
             name: str | None = None) -> None:
    """Every check ``enqueue`` makes of a submission, writing nothing (InvalidJob): a dry run's."""
    check(kind, payload, owner, max_attempts, queue, name)


def repeat_of(connection: Redis, owner: str, idempotency_key: str | None) -> str | None:
    """The job a repeat of this owner's idempotency key returns, else None. A repeat returns the
    job whatever today's limits say of its payload: an earlier release (or setting) accepted it,
    and limits apply to new jobs only."""
    if _is_key(owner) and _is_key(idempotency_key):
        return job_for_key(connection, owner, idempotency_key)
    return None


def enqueue(connection: Redis, kind: str, payload: dict, owner: str = "default",
            max_attempts: int | None = None, idempotency_key: str | None = None,
            queue: str | None = None, now: float | None = None, name: str | None = None,
            price: dict | None = None, webhook_url: str | None = None, after=None,
            after_policy: str | None = None) -> tuple[str, bool]:
    """Enqueue a job; returns ``(job_id, created)``. With an idempotency key already used by
    this owner, returns the first job's id and ``created=False`` and writes nothing. The owner's
    queued cap is taken here, in one step with its check (``jobs.intake.door``: QueueFull at the
    cap); the doors (API, form, ``leash submit``) submit through ``jobs.intake.submission``,
    which asks ``jobs.intake.admission.check`` first for the other limits (daily budget,
    submission rate).

    The idempotency key is written in the same transaction as the job, so it never points at
    a job that does not exist: concurrent submissions with one key race on WATCH, the losers
    read the winner's id, and a submission cut short (Redis stalled, client gone) left
    nothing behind, so its retry creates the job. ``price``: the job's estimate
    (jobs/intake/estimate.py), kept in its record for the job page (the doors make it).
    ``webhook_url``: where its completion webhook goes (jobs/webhooks/), else LEASH_WEBHOOK_URL.
    ``after``: ids of the owner's jobs it waits for, ``after_policy`` what if one does not succeed
    (jobs/core/parents.py)."""
    existing = repeat_of(connection, owner, idempotency_key)
    if existing is not None:
        return existing, False
    return write(connection, check(kind, payload, owner, max_attempts, queue, name, idempotency_key, webhook_url,
                                   after, after_policy), now, price)


def write(connection: Redis, job: Checked, now: float | None = None, price: dict | None = None) -> tuple[str, bool]:
    """Put a checked submission on the queue (``enqueue`` without its checks, which ``check``
    made): ``(job_id, created)`` as ``enqueue`` answers; QueueFull at the owner's cap."""
    s = settings()
    kind, payload, owner, max_attempts, total, name, queue_name, idempotency_key = job[:8]
    idem_key = keys.idempotency(owner, idempotency_key) if idempotency_key else None
    legacy_key = keys.legacy_idempotency(owner, idempotency_key) if idempotency_key else None
    parents.check_owned(connection, list(job.after), owner)
    q = rq_queue(connection, queue_name)
    job_id = new_job_id()
    door.take(connection, owner, job_id)  # QueueFull at the owner's cap; else a place is held
    created = False
    try:
        for _ in range(5):
            stamp = clock.wall() if now is None else now
            with connection.pipeline() as pipe:
                waiting_on = parents.still_running(pipe, list(job.after))  # watched: an ending restarts this
                if idem_key:
                    pipe.watch(idem_key, legacy_key)
                    existing = pipe.get(idem_key)
                    if existing is not None:
                        return existing.decode(), False
                    earlier = _job_of_legacy_key(pipe, owner, idempotency_key)
                    if earlier is not None:
                        return earlier, False
                    pipe.multi()
                    pipe.set(idem_key, job_id, ex=s.result_ttl)
                    if writes_legacy_key(owner):
                        # The previous release's form too, so a repeat it takes (a deploy's overlap,
                        # a rollback) returns this job; never over another owner's key (nx).
                        pipe.set(legacy_key, job_id, ex=s.result_ttl, nx=True)
                elif job.after:
                    pipe.multi()
                registry, concurrency = _write_job(pipe, q, job_id, kind, payload, owner, max_attempts, total,
                                                   stamp, s, name, price, job.webhook_url,
                                                   (job.after, job.after_policy, waiting_on), job.pipeline)
                door.written(pipe, owner, job_id)  # in the queued index and out of the holds at once
                try:
                    _execute_without_script_check(pipe, registry, concurrency)
                except WatchError:
                    continue  # another submission with this key won; read its job id
            created = True
            return job_id, True
    finally:
        if not created:
            door.give_back(connection, owner, job_id)
    raise InvalidJob("the idempotency key is being used by many submissions at once; retry")


def job_for_key(connection: Redis, owner: str, idempotency_key: str) -> str | None:
    """The job this owner's idempotency key already points at, in this release's form or an
    earlier one's (jobs.intake.admission lets such a repeat in: it writes nothing)."""
    job_id = connection.get(keys.idempotency(owner, idempotency_key))
    return job_id.decode() if job_id is not None else _job_of_legacy_key(connection, owner, idempotency_key)


def writes_legacy_key(owner: str) -> bool:
    """Whether a submission also writes its idempotency key in the previous release's form
    (``keys.legacy_idempotency``). Only for an owner without a colon: that form cannot tell
    owner "team" + key "ops:k1" from owner "team:ops" + key "k1", and the previous release
    returns whatever job it finds there without checking its owner."""
    return ":" not in owner


def _job_of_legacy_key(connection: Redis, owner: str, idempotency_key: str) -> str | None:
    """The job an idempotency key of an earlier release points at, if it is this owner's."""
    job_id = connection.get(keys.legacy_idempotency(owner, idempotency_key))
    if job_id is None:
        return None
    job_owner = connection.hget(keys.job(job_id.decode()), "owner")
    return job_id.decode() if job_owner is not None and job_owner.decode() == owner else None


#: Bytes of the submitted fields (the kind's declared ones) kept in the job hash for status
#: reads: the hash must stay under 2 KB, and the whole payload has its own key.
PARAMS_BYTES = 300
TEXT_CHARS = 200


def submitted_params(payload: dict, field_names: tuple[str, ...] = ()) -> str:
    """The kind's declared fields as submitted, cut to fit PARAMS_BYTES: a text to its first
    TEXT_CHARS characters, a list to the entries that fit, then "…"."""
    params: dict = {}
    for name in field_names:
        value = payload.get(name)
        if isinstance(value, str):
            params[name] = value if len(value) <= TEXT_CHARS else value[:TEXT_CHARS] + "…"
        elif isinstance(value, list):
            params[name] = []
            for entry in value:
                if len(json.dumps(params | {name: params[name] + [entry, "…"]})) > PARAMS_BYTES:
                    params[name].append("…")
                    break
                params[name].append(entry)
    return json.dumps(params, separators=(",", ":"))


def _write_job(pipe, q: Queue, job_id: str, kind: str, payload: dict, owner: str,
               max_attempts: int, total: int, now: float, s: Settings,
               name: str | None = None, price: dict | None = None,
               webhook_url: str | None = None, waits=((), None, ()),
               pipeline: str | None = None) -> tuple[RateLimitRegistry | None, int]:
    """leash's record and RQ's rate-limited job, queued on one transaction: no crash can leave
    either alone. Returns the owner's rate-limit registry and its concurrency."""
    # Counters (attempts, token, done, handoffs, defers) start absent, meaning 0.
    pipe.hset(keys.job(job_id), mapping={
        "kind": kind, "owner": owner, "queue": q.name, "state": "queued",
        "max_attempts": max_attempts, "total": total, "created_at": now, "updated_at": now,
        "params": submitted_params(payload, tuple(f.name for f in kinds.get(kind).fields)),
        # What the job may spend (model_admit_v3 reads it; a replay may raise it).
        **(budget.parse(payload.get(budget.BUDGET_FIELD)) or budget.Budget()).hash_fields(),
    } | ({"name": name} if name else {}) | ({"mode": "batch"} if modes.mode_of(payload) == "batch" else {})
      | ({"webhook_url": webhook_url} if webhook_url else {})
      | ({"after": ",".join(waits[0]), "after_policy": waits[1]} if waits[0] else {})
      | ({"pipeline": pipeline} if pipeline else {}))
    if price:  # apart from the job hash, which every status poll reads
        pipe.set(keys.estimate(job_id), json.dumps(price, separators=(",", ":")), ex=s.result_ttl)
    # The copy expires like the idempotency key unless the job's end sets its record's expiry:
    # a worker of the previous release ends jobs without knowing this key (docs/OPERATIONS.md).
    pipe.set(keys.payload(job_id), payload_copy.encode(payload), ex=s.result_ttl)
    pipe.zadd(keys.owner_jobs(owner), {job_id: now})
    pipe.persist(keys.owner_jobs(owner))  # lists a queued job now: expires no more (state_index)
    pipe.zadd(keys.owner_state(owner, "queued"), {job_id: now})  # then the Lua transitions move it
    pipe.zadd(keys.ACTIVE, {job_id: now})
    pipe.sadd(q.redis_queues_keys, q.key)  # as RQ's enqueue_job does: `rq info`, dashboards
    job = rq_job_for(q, job_id, kind, payload, owner, max_attempts, total, s,
                     depends_on=parents.dependency(list(waits[2]), waits[1]))
    if waits[2]:  # a job it waits for has not ended: RQ's deferred registry holds it until then
        parents.write_waiting(job, pipe)
        return None, job.rate_limit_concurrency
    return wait_for_slot(q, job, pipe, score=now), job.rate_limit_concurrency


class _CallableModule(types.ModuleType):
    """``jobs.enqueue(...)`` is the documented way to submit from Python, and ``jobs.enqueue``
    is also this module: the package imports nothing until asked (``import jobs.config`` must
    stay light), so the name cannot be rebound to the function once this module is loaded.
    Calling the module calls ``enqueue``."""

    def __call__(self, *args, **kwargs) -> tuple[str, bool]:
        return enqueue(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
