"""The queued cap (``LEASH_MAX_QUEUED_PER_OWNER``), checked and taken in one step.

    submit ──take──▶ hold (a place, for this job id) ──write──▶ queued (the hold goes with it)
                 └─▶ QueueFull (429)                  └─ died before writing: the hold lapses

``take`` runs ``door_take_v1``: it counts the owner's queued index plus the places other
submissions hold, refuses at the cap, or holds a place for the job id. ``jobs.enqueue`` writes
the job and removes its hold in one transaction, so concurrent submitters can never pass the
cap together: 64 at once against a cap of 20 queue exactly 20. A replay (``replay_v4``) counts
the same two sets inside its own script. A place is held for HOLD_SECONDS at most: a writer
that died between taking and writing gives it back then.
"""

from __future__ import annotations

from redis import Redis
from redis.exceptions import RedisError

from jobs import keys
from jobs.config import quotas
from jobs.core import clock
from jobs.errors import QueueFull
from jobs.lifecycle import scripts

#: Seconds a submission's place is held until its job is written: the write is one round trip
#: after the take; this only bounds what a submitter that died in between keeps.
HOLD_SECONDS = 60
#: Seconds a client refused for too many queued jobs is told to wait: jobs take minutes, so
#: asking again sooner than this rarely finds a free place.
QUEUED_RETRY_AFTER = 60


def cap() -> int:
    return quotas.admission().max_queued_per_owner


def too_many_queued(owner: str, queued: int, limit: int) -> str:
    """The refusal's text: who, how many, the cap and the setting, what to do."""
    return (f"too many jobs waiting: owner {owner!r} has {queued} queued (at most {limit}, "
            "LEASH_MAX_QUEUED_PER_OWNER); submit again once some have started, or cancel some")


def count(connection: Redis, owner: str, now: float | None = None) -> int:
    """Places of the owner's cap taken now (queued jobs and live holds): a read, for an early
    refusal; only ``take`` decides."""
    now = clock.wall() if now is None else now
    with connection.pipeline(transaction=False) as pipe:
        pipe.zcard(keys.owner_state(owner, "queued"))
        pipe.zcount(keys.owner_door_holds(owner), f"({now}", "+inf")
        queued, held = pipe.execute()
    return int(queued) + int(held)


def take(connection: Redis, owner: str, job_id: str) -> None:
    """Hold a place of the owner's cap for ``job_id``, or raise QueueFull naming the cap."""
    limit = cap()
    taken, places = scripts.run(connection, "door_take_v1",
                                keys={"queued": keys.owner_state(owner, "queued"),
                                      "door_holds": keys.owner_door_holds(owner)},
                                args=[job_id, HOLD_SECONDS, limit])
    if not int(taken):
        raise QueueFull(too_many_queued(owner, int(places), limit), retry_after=QUEUED_RETRY_AFTER)


def written(pipe, owner: str, job_id: str) -> None:
    """Queue, on the transaction that writes the job into the queued index, its hold's removal."""
    pipe.zrem(keys.owner_door_holds(owner), job_id)


def give_back(connection: Redis, owner: str, job_id: str) -> None:
    """The hold of a job that was not written (a repeat of an idempotency key, an error). With
    Redis unreachable it is left to lapse: the error the caller meets is the one to report."""
    try:
        connection.zrem(keys.owner_door_holds(owner), job_id)
    except RedisError:
        pass
