"""What the Redis under leash is like, for ``leash doctor`` and the start-up warnings.

Each check is a ``Check``: a name, a verdict (ok, warn, fail) and what was seen, with the fix
when it is not ok. Only reads: INFO, CONFIG GET (which managed plans may refuse: then INFO's
view is used), TIME, and RQ's worker records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC

import redis
from redis import Redis
from rq.serializers import JSONSerializer
from rq.worker import Worker
from sqlalchemy.engine import make_url

from jobs import keys
from jobs.archive import pending
from jobs.config import stores
from jobs.core.store.connection import is_out_of_memory

#: RQ 3.0 needs LMOVE / BLMOVE (Redis 6.2).
MIN_VERSION = (6, 2)
#: Used memory, as a share of maxmemory, from which the headroom is a warning, then a failure.
WARN_USED, FAIL_USED = 0.8, 0.95
#: A worker's heartbeat this far ahead of Redis' clock, or older than this, means its clock is off
#: (leases are stamped with the workers' clocks) or it stopped.
SKEW_SECONDS = 2.0
SILENT_SECONDS = 60.0

EVICTION_DESTROYS = ("maxmemory-policy {policy} lets Redis evict keys when it is full: finished jobs' "
                     "records and results vanish ('no such job'), or a job says succeeded with its items "
                     "gone; set maxmemory-policy noeviction (a full Redis then refuses new jobs with a 503 "
                     "and keeps every stored one)")


@dataclass
class Check:
    name: str
    verdict: str  # ok | warn | fail
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


def eviction_warning(connection: Redis) -> str | None:
    """The warning a worker or the web app logs at start when Redis may evict, else None."""
    try:
        policy = connection.info("memory").get("maxmemory_policy", "noeviction")
    except redis.exceptions.RedisError:
        return None  # unreachable: said elsewhere
    return None if policy == "noeviction" else EVICTION_DESTROYS.format(policy=policy)


def _config(connection: Redis, name: str) -> str | None:
    try:
        return connection.config_get(name).get(name)
    except redis.exceptions.ResponseError:
        return None  # CONFIG refused (managed plans)


def checks(connection: Redis) -> list[Check]:
    info = connection.info()
    return [_version(info), _persistence(connection, info), *_memory(info),
            _clients(connection, info), *_workers(connection), archive_check(connection)]



#: Seconds the oldest ended job may wait for the archive before it counts as behind.
ARCHIVE_LATE = 300.0


def archive_check(connection: Redis) -> Check:
    """Where results are kept: the archive, and whether it keeps up (jobs/archive/)."""
    url = stores.archive().url
    if url is None:
        return Check("archive", "warn", "none: results stay in Redis for LEASH_RESULT_TTL (set DATABASE_URL or "
                     "LEASH_ARCHIVE_URL to keep them in SQL, docs/ARCHIVE.md)")
    where = make_url(url).render_as_string(hide_password=True)
    behind = pending.behind(connection)
    if behind["error"] or behind["oldest_seconds"] > ARCHIVE_LATE:
        why = f": {behind['error']}" if behind["error"] else ""
        return Check("archive", "fail", f"{where} is behind: {behind['waiting']} ended jobs wait, the oldest for "
                     f"{behind['oldest_seconds']:.0f} s (whole in Redis until archived){why}")
    return Check("archive", "ok", f"{where}, {behind['waiting']} ended jobs waiting")


def server(info: dict) -> tuple[str, str]:
    """The server's name and its own version from INFO server: Valkey says ``server_name:valkey``
    and ``valkey_version`` (its ``redis_version`` stays the Redis 7.2.4 it answers as)."""
    name = str(info.get("server_name") or "redis").lower()
    if name == "valkey" or "valkey_version" in info:
        return "Valkey", str(info.get("valkey_version") or info.get("redis_version", "?"))
    return ("Redis" if name == "redis" else name), str(info.get("redis_version", "?"))


def _version(info: dict) -> Check:
    name, version = server(info)
    compatible = str(info.get("redis_version", "0"))
    seen = f"{name} {version}" + (f" (answers as Redis {compatible})" if name != "Redis" else "")
    parts = tuple(int(p) for p in compatible.split(".")[:2] if p.isdigit())
    if parts >= MIN_VERSION:
        return Check("server", "ok", seen)
    return Check("server", "fail", f"{seen}: leash needs Redis {'.'.join(map(str, MIN_VERSION))} or newer "
                 "(or Valkey)")


def _persistence(connection: Redis, info: dict) -> Check:
    aof = bool(info.get("aof_enabled"))
    save = _config(connection, "save")
    rdb = bool(save) if save is not None else info.get("rdb_last_save_time", 0) > 0
    seen = f"AOF {'on' if aof else 'off'}, RDB snapshots {'on' if rdb else 'off'}"
    if aof:
        return Check("persistence", "ok", seen)
    if rdb:
        return Check("persistence", "warn", seen + ": a crash loses the writes since the last snapshot; "
                     "set appendonly yes")
    return Check("persistence", "fail", seen + ": a Redis restart forgets every job; set appendonly yes")


def _memory(info: dict) -> list[Check]:
    policy = info.get("maxmemory_policy", "noeviction")
    limit, used = int(info.get("maxmemory", 0)), int(info.get("used_memory", 0))
    out = [Check("maxmemory-policy", "ok", policy) if policy == "noeviction"
           else Check("maxmemory-policy", "fail", EVICTION_DESTROYS.format(policy=policy))]
    if not limit:
        out.append(Check("maxmemory", "warn", f"not set ({used / 2**20:.1f} MB used): the kernel's OOM killer is "
                         "the limit; set maxmemory below the instance's memory"))
        return out
    share = used / limit
    detail = f"{used / 2**20:.1f} MB used of {limit / 2**20:.1f} MB ({share:.0%})"
    verdict = "fail" if share >= FAIL_USED else "warn" if share >= WARN_USED else "ok"
    if verdict != "ok":
        detail += ": shorten LEASH_RESULT_TTL or raise maxmemory (docs/OPERATIONS.md, sizing)"
    out.append(Check("memory headroom", verdict, detail))
    return out


def _clients(connection: Redis, info: dict) -> Check:
    connected = int(info.get("connected_clients", 0))
    limit = info.get("maxclients") or _config(connection, "maxclients")
    if not limit:
        return Check("clients", "ok", f"{connected} connected (maxclients unknown)")
    share = connected / int(limit)
    verdict = "fail" if share >= FAIL_USED else "warn" if share >= WARN_USED else "ok"
    return Check("clients", verdict, f"{connected} connected of maxclients {limit}")


def _workers(connection: Redis) -> list[Check]:
    workers = Worker.all(connection=connection, serializer=JSONSerializer)
    if not workers:
        return [Check("workers", "fail", "none seen: queued jobs will not run; start `leash worker`")]
    seconds, micros = connection.time()
    redis_now = seconds + micros / 1e6
    out = [Check("workers", "ok", f"{len(workers)} seen")]
    for worker in workers:
        beat = worker.last_heartbeat
        if beat is None:
            continue
        age = redis_now - beat.replace(tzinfo=beat.tzinfo or UTC).timestamp()
        if age < -SKEW_SECONDS:
            out.append(Check(f"clock of worker {worker.name}", "fail",
                             f"{-age:.1f} s ahead of Redis' clock: leases are stamped with it; sync it (NTP)"))
        elif age > SILENT_SECONDS:
            out.append(Check(f"clock of worker {worker.name}", "warn",
                             f"last heartbeat {age:.0f} s ago by Redis' clock: stopped, stuck, or its clock is behind"))
        else:
            out.append(Check(f"clock of worker {worker.name}", "ok",
                             f"heartbeat {age:.1f} s old by Redis' clock (skew under {SKEW_SECONDS:.0f} s)"))
    return out




#: What ``readiness`` reports for each problem.
WRITES_REFUSED = "writes refused (Redis full): submissions and job progress wait until memory is freed"
NO_WORKERS = "no workers: queued jobs will not run; start `leash worker`"


def readiness(connection: Redis) -> list[str]:
    """What keeps this deployment from doing its work, beyond answering reads: a Redis that
    refuses writes (full, with noeviction) and no worker registered. Empty when ready. One
    small write (an expiring probe key) tells the first truly: INFO's figures only estimate
    when Redis refuses."""
    problems = []
    try:
        connection.set(keys.READY_PROBE, "1", px=1000)
    except redis.exceptions.ResponseError as exc:
        if not is_out_of_memory(exc):
            raise
        problems.append(WRITES_REFUSED)
    if not Worker.all(connection=connection, serializer=JSONSerializer):
        problems.append(NO_WORKERS)
    archive = archive_check(connection)
    if archive.verdict == "fail":
        problems.append(f"archive: {archive.detail}")
    return problems
