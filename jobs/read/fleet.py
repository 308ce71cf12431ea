"""The operator's view across owners: every worker (``leash workers``) and every queue
(``leash queue``), the same figures as /metrics and the overview. Workers come from RQ's own
registry of workers; queues from RQ's lists and registries, walked in bounded slices (never a
scan of Redis's keys)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from redis import Redis
from rq.rate_limit import RateLimitRegistry
from rq.serializers import JSONSerializer
from rq.utils import utcparse
from rq.worker import Worker

from jobs import keys
from jobs.config import settings
from jobs.core import clock, switches
from jobs.core.text import decoded

#: How many entries of a queue (and of its scheduled registry) are read for the per-owner counts.
OWNER_WALK = 10_000
#: How many jobs at the head of a queue are read for its oldest age (the head is the oldest but
#: for jobs put back at the front: a hand-off, a job taken while the queue was paused).
HEAD = 10


@dataclass
class WorkerRow:
    name: str
    state: str  #: busy, idle, quiet (finishing its job or done; takes no new one) or suspended (`rq suspend`)
    since: float | None  #: when it entered that state (busy: when its job's attempt started)
    job_id: str | None
    job_owner: str | None
    queues: list[str]
    host: str | None
    pid: int | None
    quiet_since: float | None
    last_heartbeat: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def workers(connection: Redis) -> list[WorkerRow]:
    """Every registered worker, busy first."""
    found = Worker.all(connection=connection, serializer=JSONSerializer)
    quiet = switches.quiet_workers(connection, alive={w.name for w in found})
    with connection.pipeline(transaction=False) as pipe:
        for worker in found:
            pipe.hget(worker.key, "leash_state_since")
        since_of = pipe.execute()
    rows = []
    for worker, since in zip(found, since_of, strict=True):
        job_id = worker.get_current_job_id()
        state = worker.get_state()
        state = getattr(state, "value", state) or "idle"
        since = float(since) if since else (worker.birth_date.timestamp() if worker.birth_date else None)
        owner = None
        if job_id:
            state = "busy"
            owner, started, looked = connection.hmget(keys.job(job_id), "owner", "started_at", "looked_at")
            moment = max(float(started or 0), float(looked or 0))
            since, owner = (moment or since), decoded(owner)
        if worker.name in quiet and state != "busy":
            state = "quiet"
        rows.append(WorkerRow(
            name=worker.name, state=state, since=since, job_id=job_id, job_owner=owner,
            queues=worker.queue_names(), host=worker.hostname, pid=worker.pid,
            quiet_since=quiet.get(worker.name),
            last_heartbeat=worker.last_heartbeat.timestamp() if worker.last_heartbeat else None))
    return sorted(rows, key=lambda r: (r.state != "busy", r.name))


def worker_states(connection: Redis) -> dict[str, int]:
    """How many workers are in each state (/metrics)."""
    counts = {"busy": 0, "idle": 0, "quiet": 0, "suspended": 0}
    for row in workers(connection):
        counts[row.state] = counts.get(row.state, 0) + 1
    return counts


@dataclass
class QueueRow:
    queue: str
    queued: int  #: ready to run, in RQ's queue
    waiting: int  #: held by RQ for later: a retry's backoff, a batch job's next look, a deferral
    held: int  #: waiting for a slot of their owner's concurrency limit (RQ's RateLimit)
    oldest_age: float | None  #: seconds the oldest job ready to run has been queued
    paused_since: float | None
    owners: dict[str, dict[str, int]] = field(default_factory=dict)  #: owner -> {"queued", "waiting", "held"}

    def as_dict(self) -> dict:
        return asdict(self)


def known_queues(connection: Redis, configured: list[str] | tuple[str, ...]) -> set[str]:
    """The queues an operator may name: the deployment's (LEASH_QUEUE) and every queue RQ knows."""
    known = {k.decode().removeprefix(keys.rq_queue("")) for k in connection.smembers(keys.rq_queues_set())}
    return set(configured) | known


def oldest_ages(connection: Redis, names: list[str], now: float | None = None) -> dict[str, float | None]:
    """Seconds the oldest ready job of each queue has waited (RQ's enqueued_at of the head)."""
    now = clock.wall() if now is None else now
    with connection.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.lrange(keys.rq_queue(name), 0, HEAD - 1)
        heads = pipe.execute()
    with connection.pipeline(transaction=False) as pipe:
        for ids in heads:
            for raw in ids:
                pipe.hget(keys.rq_job(raw.decode()), "enqueued_at")
        stamps = iter(pipe.execute())
    ages: dict[str, float | None] = {}
    for name, ids in zip(names, heads, strict=True):
        times = [utcparse(s.decode()).timestamp() for s in (next(stamps) for _ in ids) if s]
        ages[name] = max(0.0, now - min(times)) if times else None
    return ages


def _held(connection: Redis) -> dict[str, dict[str, int]]:
    """Jobs waiting for a slot of their owner's concurrency limit: queue -> owner -> count."""
    held_ids = [job_id for registry in RateLimitRegistry.all(connection)
                for job_id in registry.get_rate_limited_job_ids()[:OWNER_WALK]]
    with connection.pipeline(transaction=False) as pipe:
        for job_id in held_ids:
            pipe.hmget(keys.job(job_id), "queue", "owner")
        rows = pipe.execute()
    held: dict[str, dict[str, int]] = {}
    for queue, owner in rows:
        if queue is not None:
            by_owner = held.setdefault(queue.decode(), {})
            by_owner[decoded(owner) or "?"] = by_owner.get(decoded(owner) or "?", 0) + 1
    return held


def queues(connection: Redis, names: list[str] | None = None, now: float | None = None) -> list[QueueRow]:
    names = list(names or settings().queues)
    paused = switches.paused(connection)
    ages = oldest_ages(connection, names, now)
    held = _held(connection)
    rows = []
    for name in names:
        queued_ids = [raw.decode() for raw in connection.lrange(keys.rq_queue(name), 0, OWNER_WALK - 1)]
        waiting_ids = [raw.decode() for raw in
                       connection.zrange(keys.rq_scheduled(name, connection), 0, OWNER_WALK - 1)]
        with connection.pipeline(transaction=False) as pipe:
            pipe.llen(keys.rq_queue(name))
            pipe.zcard(keys.rq_scheduled(name, connection))
            for job_id in queued_ids + waiting_ids:
                pipe.hget(keys.job(job_id), "owner")
            queued, waiting, *owner_of = pipe.execute()
        owners: dict[str, dict[str, int]] = {}
        for n, owner in enumerate(owner_of):
            counts = owners.setdefault(decoded(owner) or "(not a leash job)", {"queued": 0, "waiting": 0, "held": 0})
            counts["queued" if n < len(queued_ids) else "waiting"] += 1
        for owner, count in held.get(name, {}).items():
            owners.setdefault(owner, {"queued": 0, "waiting": 0, "held": 0})["held"] += count
        rows.append(QueueRow(name, queued, waiting, sum(held.get(name, {}).values()), ages[name],
                             paused.get(name), owners))
    return rows


@dataclass(frozen=True)
class ScrapeCounts:
    """What /metrics counts from Redis at each scrape."""

    ready: list[int]  #: per queue, in the order asked: jobs waiting in RQ's queue
    scheduled: list[int]  #: per queue: jobs waiting for a retry's backoff to pass
    running: int  #: jobs holding a lease
    stale: int  #: of those, leases already expired
    failed_index: int
    totals: dict[str, int]  #: ``outcome:kind`` -> jobs ended so
    reclaims: int
    rejected_writes: int


def scrape_counts(connection: Redis, queue_names: list[str], now: float) -> ScrapeCounts:
    """/metrics' counts, in one round trip."""
    with connection.pipeline(transaction=False) as pipe:
        for queue in queue_names:
            pipe.llen(keys.rq_queue(queue))
            pipe.zcard(keys.rq_scheduled(queue, connection))
        pipe.zcard(keys.LEASES)
        pipe.zcount(keys.LEASES, "-inf", now)
        pipe.zcard(keys.FAILED_INDEX)
        pipe.hgetall(keys.STATS_TOTALS)
        pipe.get(keys.RECLAIMS)
        pipe.get(keys.REJECTED_WRITES)
        replies = pipe.execute()
    per_queue, rest = replies[:2 * len(queue_names)], replies[2 * len(queue_names):]
    running, stale, failed_index, totals, reclaims, rejected = rest
    return ScrapeCounts(ready=per_queue[0::2], scheduled=per_queue[1::2], running=running, stale=stale,
                        failed_index=failed_index, totals={decoded(k): int(v) for k, v in totals.items()},
                        reclaims=int(reclaims or 0), rejected_writes=int(rejected or 0))


def queue_exists(connection: Redis, name: str) -> bool:
    """Whether RQ's list of the queue holds a job (an empty queue's list does not exist)."""
    return bool(connection.exists(keys.rq_queue(name)))
