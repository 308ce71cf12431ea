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
"""

from __future__ import annotations

from redis import Redis
from rq.command import send_command

from jobs import keys
from jobs.core import clock

#: The command a worker handles to become quiet (sent on RQ's pubsub channel of the worker).
QUIET_COMMAND = "leash-quiet"


def pause(connection: Redis, queue: str, now: float | None = None) -> bool:
    """Pause a queue; False if it was paused already (the first pause's time is kept)."""
    return bool(connection.hsetnx(keys.PAUSED, queue, clock.wall() if now is None else now))


def resume(connection: Redis, queue: str) -> bool:
    """Resume a queue; False if it was not paused."""
    return bool(connection.hdel(keys.PAUSED, queue))


def paused(connection: Redis) -> dict[str, float]:
    """The paused queues and since when (unix seconds)."""
    return {k.decode(): float(v) for k, v in connection.hgetall(keys.PAUSED).items()}


def quiet(connection: Redis, worker_names: list[str], now: float | None = None) -> list[str]:
    """Tell workers to finish their job and take no new one; the names newly made quiet."""
    now = clock.wall() if now is None else now
    told = []
    for name in worker_names:
        if connection.hsetnx(keys.QUIET, name, now):
            told.append(name)
        send_command(connection, name, QUIET_COMMAND)  # at once, if it listens; the record holds anyway
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
