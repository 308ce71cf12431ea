"""The operator's switches: a paused queue and a quiet worker.

    pause QUEUE     workers stay up and take nothing from it; its jobs stay queued, in order
    resume QUEUE    they take from it again (within a dequeue's wait: a few seconds)
    quiet WORKER    the worker finishes the job it runs and takes no new one (Sidekiq's quiet;
                    SIGTSTP to the worker does the same); SIGTERM then stops it with nothing to
                    hand back

Both are records in Redis (keys.PAUSED, keys.QUIET) that workers read before every dequeue and
again before every claim, so a switch thrown while a worker waits in its dequeue still holds:
a job taken from a paused queue, or by a quiet worker, goes back to the front of its queue
unclaimed. A quiet worker is also told at once through RQ's worker commands (pubsub).

Each switch thrown with an ``actor`` (the CLI, the operator's API and buttons) leaves an audit
entry (who, what, when, whether it changed anything) in a capped stream: ``audit_log``.
"""

from __future__ import annotations

from redis import Redis
from rq.command import send_command

from jobs import keys
from jobs.core import clock
from jobs.core.text import decoded

#: The command a worker handles to become quiet (sent on RQ's pubsub channel of the worker).
QUIET_COMMAND = "leash-quiet"


def pause(connection: Redis, queue: str, now: float | None = None, actor: str | None = None) -> bool:
    """Pause a queue; False if it was paused already (the first pause's time is kept)."""
    now = clock.wall() if now is None else now
    changed = bool(connection.hsetnx(keys.PAUSED, queue, now))
    _audit(connection, actor, "pause", [queue], changed, now)
    return changed


def resume(connection: Redis, queue: str, actor: str | None = None) -> bool:
    """Resume a queue; False if it was not paused."""
    changed = bool(connection.hdel(keys.PAUSED, queue))
    _audit(connection, actor, "resume", [queue], changed, clock.wall())
    return changed


def paused(connection: Redis) -> dict[str, float]:
    """The paused queues and since when (unix seconds)."""
    return {k.decode(): float(v) for k, v in connection.hgetall(keys.PAUSED).items()}


def quiet(connection: Redis, worker_names: list[str], now: float | None = None,
          actor: str | None = None) -> list[str]:
    """Tell workers to finish their job and take no new one; the names newly made quiet."""
    now = clock.wall() if now is None else now
    told = []
    for name in worker_names:
        if connection.hsetnx(keys.QUIET, name, now):
            told.append(name)
        send_command(connection, name, QUIET_COMMAND)  # at once, if it listens; the record holds anyway
    _audit(connection, actor, "quiet", worker_names, bool(told), now)
    return told


def quiet_since(connection: Redis, worker_name: str) -> float | None:
    value = connection.hget(keys.QUIET, worker_name)
    return float(value) if value is not None else None


def quiet_workers(connection: Redis, alive: set[str] | None = None) -> dict[str, float]:
    """The quiet workers and since when; given the live workers' names, the others' entries go."""
    found = {k.decode(): float(v) for k, v in connection.hgetall(keys.QUIET).items()}
    if alive is not None and (gone := [name for name in found if name not in alive]):
        connection.hdel(keys.QUIET, *gone)
        found = {name: since for name, since in found.items() if name in alive}
    return found


def forget_worker(connection: Redis, worker_name: str) -> None:
    """A worker stopping takes its quiet record with it (a new one under its name starts afresh)."""
    connection.hdel(keys.QUIET, worker_name)


def _audit(connection: Redis, actor: str | None, action: str, targets: list[str], changed: bool, now: float) -> None:
    if actor is None:
        return
    entry = {"actor": actor, "at": repr(now), "action": action, "targets": ",".join(targets),
             "changed": "1" if changed else "0"}
    connection.xadd(keys.OPERATOR_AUDIT, entry, maxlen=keys.OPERATOR_AUDIT_MAXLEN, approximate=True)


def audit_log(connection: Redis, count: int = 20) -> list[dict]:
    """The latest switches thrown (pause, resume, quiet), newest first."""
    out = []
    for entry_id, fields in connection.xrevrange(keys.OPERATOR_AUDIT, count=count):
        f = {decoded(k): decoded(v) for k, v in fields.items()}
        out.append({"id": decoded(entry_id), "actor": f.get("actor"), "at": clock.iso(float(f.get("at") or 0)),
                    "action": f.get("action"), "targets": [t for t in (f.get("targets") or "").split(",") if t],
                    "changed": f.get("changed") == "1"})
    return out
