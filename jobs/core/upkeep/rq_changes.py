"""Which jobs RQ's side may have changed for since the last consistency sweep, found by
comparing sizes instead of reading every job.

RQ's tools act on RQ's keys only, and every one of them moves a size that costs one command
to read:

- ``rq empty``, rq-dashboard's Empty and Delete, ``job.delete()`` and RQ's own failing or
  canceling move a queue's list or one of its registries (started, scheduled, failed,
  canceled, the taken-but-not-started list);
- ``job.delete()``, ``job.cancel()`` and a requeue move an owner's balance: the number of
  jobs leash has queued or running for the owner minus those RQ holds in the owner's rate
  limit (using a slot, or waiting for one). Jobs that merely move along (promoted, claimed,
  ended and their slot released) leave it as it was, so a busy owner is not compared again
  and again.

A sweep reads those sizes (one round trip: a few commands per queue and per owner, however
many jobs wait) and compares them with what the last sweep saw. Only when a queue's sizes
moved are the jobs using an owner slot checked (at most the owners' concurrency, not the
queue); only when an owner's balance moved are that owner's sets compared, inside Redis
(ZDIFF), to name the jobs one side holds and the other does not. A tick where nothing moved
reads no job at all. What moved but is not settled yet (a requeue not yet believed) is left
unrecorded, so the next tick looks again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from redis import Redis
from rq.rate_limit import RateLimitRegistry

from jobs import keys
from jobs.core.text import decoded

OWNER_LIMIT_PREFIX = keys.owner_rate_limit_key("")


@dataclass
class Changes:
    """What a sweep must look at, and what to record once it has."""

    #: Every job using an owner slot, by its owner's registry (a queue's sizes moved).
    holders: list[tuple[RateLimitRegistry, str, bool]] = field(default_factory=list)
    #: Jobs one side holds and the other does not, by owner.
    suspects: dict[str, list[str]] = field(default_factory=dict)
    queues_seen: dict[str, str] = field(default_factory=dict)
    owners_seen: dict[str, str] = field(default_factory=dict)
    owners_gone: list[str] = field(default_factory=list)

    def job_ids(self) -> list[str]:
        ids = [job_id for _, job_id, _ in self.holders]
        for owner_ids in self.suspects.values():
            ids += owner_ids
        return list(dict.fromkeys(ids))


def _queue_sizes(connection: Redis, queue_names: list[str]) -> dict[str, str]:
    with connection.pipeline(transaction=False) as pipe:
        for name in queue_names:
            pipe.llen(keys.rq_queue(name))
            pipe.llen(keys.rq_intermediate(name, connection))
            for registry in (keys.rq_started, keys.rq_scheduled, keys.rq_failed, keys.rq_canceled):
                pipe.zcard(registry(name, connection))
        sizes = pipe.execute()
    return {name: ",".join(str(s) for s in sizes[6 * n:6 * n + 6]) for n, name in enumerate(queue_names)}


def observe(connection: Redis) -> Changes:
    """Read the sizes, compare them with the last sweep's, and name what must be checked."""
    queue_prefix = len(keys.rq_queue(""))
    with connection.pipeline(transaction=False) as pipe:
        pipe.smembers(keys.rq_queues_set())
        pipe.smembers(RateLimitRegistry.rl_keys_key)
        pipe.hgetall(keys.SWEEP_QUEUES_SEEN)
        pipe.hgetall(keys.SWEEP_OWNERS_SEEN)
        queue_keys, limit_keys, queues_before, owners_before = pipe.execute()
    queue_names = sorted(decoded(k)[queue_prefix:] for k in queue_keys)
    queues_before = {decoded(k): decoded(v) for k, v in queues_before.items()}
    owners_before = {decoded(k): decoded(v) for k, v in owners_before.items()}
    limited = {decoded(k)[len(OWNER_LIMIT_PREFIX):] for k in limit_keys if decoded(k).startswith(OWNER_LIMIT_PREFIX)}
    owners = sorted(limited | set(owners_before))
    changes = Changes(queues_seen=_queue_sizes(connection, queue_names))
    registries = {owner: keys.rq_rate_limit(keys.owner_rate_limit_key(owner), connection) for owner in owners}
    with connection.pipeline(transaction=False) as pipe:
        for owner in owners:
            pipe.zcard(keys.owner_state(owner, "queued"))
            pipe.zcard(keys.owner_state(owner, "running"))
            pipe.zcard(registries[owner].allowed_key)
            pipe.zcard(registries[owner].rate_limited_key)
        sizes = pipe.execute()
    moved = []
    for n, owner in enumerate(owners):
        queued, running, allowed, waiting = sizes[4 * n:4 * n + 4]
        if not (queued or running or allowed or waiting) and owner not in limited:
            changes.owners_gone.append(owner)
            continue
        # What leash counts minus what RQ holds. A job moving along (promoted, claimed, ended
        # and its slot released) moves both sides alike; a job deleted, canceled or requeued
        # by RQ's tools moves one side only.
        balance = str(queued + running - allowed - waiting)
        changes.owners_seen[owner] = balance
        if owners_before.get(owner) != balance:
            moved.append(owner)
    scheduled = [keys.rq_scheduled(name, connection) for name in queue_names]
    _compare_owners(connection, moved, registries, scheduled, changes)
    if changes.queues_seen != queues_before:
        _all_holders(connection, [registries[o] for o in owners if o in limited], changes)
    return changes


def _compare_owners(connection: Redis, owners: list[str], registries: dict[str, RateLimitRegistry],
                    scheduled: list[str], changes: Changes) -> None:
    """For each owner whose balance moved: leash's queued jobs RQ holds nowhere (deleted,
    canceled or failed by RQ), and the jobs in RQ's sets that leash no longer has queued or
    running (ended: a slot to free, or a requeue by RQ's tools). Sets are compared in Redis."""
    if not owners:
        return
    with connection.pipeline(transaction=False) as pipe:
        for owner in owners:
            registry, mine = registries[owner], [keys.owner_state(owner, s) for s in ("queued", "running")]
            pipe.zdiff([keys.owner_state(owner, "queued"), registry.allowed_key, registry.rate_limited_key,
                        *scheduled])
            pipe.zdiff([registry.allowed_key, *mine])
            pipe.zdiff([registry.rate_limited_key, *mine])
        found = pipe.execute()
    for n, owner in enumerate(owners):
        missing, holding, waiting = ([decoded(j) for j in ids] for ids in found[3 * n:3 * n + 3])
        registry = registries[owner]
        changes.holders += [(registry, j, True) for j in holding] + [(registry, j, False) for j in waiting]
        if missing or holding or waiting:
            changes.suspects[owner] = missing + holding + waiting


def _all_holders(connection: Redis, registries: list[RateLimitRegistry], changes: Changes) -> None:
    """Every job using an owner slot: a job ``rq empty`` deleted still holds its slot in RQ."""
    if not registries:
        return
    with connection.pipeline(transaction=False) as pipe:
        for registry in registries:
            pipe.zrange(registry.allowed_key, 0, -1)
        members = pipe.execute()
    known = {(r.key, j) for r, j, _ in changes.holders}
    for registry, ids in zip(registries, members, strict=True):
        changes.holders += [(registry, decoded(j), True) for j in ids if (registry.key, decoded(j)) not in known]


def record(connection: Redis, changes: Changes, unsettled_owners: set[str]) -> None:
    """Remember what this sweep saw, except what is not settled yet (looked at again next tick)."""
    owners = {o: b for o, b in changes.owners_seen.items() if o not in unsettled_owners}
    with connection.pipeline(transaction=False) as pipe:
        pipe.delete(keys.SWEEP_QUEUES_SEEN)
        if changes.queues_seen:
            pipe.hset(keys.SWEEP_QUEUES_SEEN, mapping=changes.queues_seen)
        if owners:
            pipe.hset(keys.SWEEP_OWNERS_SEEN, mapping=owners)
        gone = changes.owners_gone + sorted(unsettled_owners)
        if gone:
            pipe.hdel(keys.SWEEP_OWNERS_SEEN, *gone)
        pipe.execute()
