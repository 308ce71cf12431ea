"""Taking back jobs whose lease ran out, hard-stopping cancels that were not heeded, and
keeping leash's state true after RQ's own tools acted on its jobs (jobs/core/upkeep/consistency.py).

Every worker calls ``tick()`` — while busy (from its horse-monitoring loop) and while idle
(its dequeue wakes every few seconds) — so no separate process is needed. A shared throttle
key lets one worker per interval do the work; each queue is reaped under RQ's own
maintenance lock so RQ's registry cleanup and leash never act on a queue at once. The
reclaim itself is one Lua script that re-checks the lease, so a job is never requeued twice.
"""

from __future__ import annotations

import logging

import redis
from redis import Redis
from rq import Queue
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.rate_limit import RateLimitRegistry

from jobs import keys
from jobs.config import settings
from jobs.core import clock, lease, state_index
from jobs.core.store import memory_wait
from jobs.core.store.connection import is_out_of_memory
from jobs.core.text import summary_of_ids
from jobs.core.upkeep import consistency
from jobs.lifecycle import transitions

log = logging.getLogger("leash.reaper")

BATCH = 200


def lease_expired_message(job_id: str, worker: str | None, expired_at: float | None, now: float) -> str:
    late = f" {now - expired_at:.1f}s ago" if expired_at else ""
    who = f" on worker {worker}" if worker else ""
    return f"lease expired{late}{who}: the worker stopped renewing it (killed, hung or partitioned)"


#: Seconds a job may sit taken-but-unclaimed in RQ's intermediate list before it is requeued
#: (a live worker claims within milliseconds; RQ's own cleanup waits a minute, then fails it).
SWALLOWED_AFTER = 5.0


class Reaper:
    def __init__(self, connection: Redis, name: str, interval: float, queue_names: tuple[str, ...] = (),
                 adopt_requeues=None, count_abandoned_calls=None):
        self.connection = connection
        self.adopt_requeues = adopt_requeues  # jobs.deadletter.adopt_requeues, from the worker
        # jobs.usage.budget.sweep_reservations, from the worker (money is a layer above the core).
        self.count_abandoned_calls = count_abandoned_calls
        self.name = name
        self.interval = interval
        self.queue_names = queue_names
        self._next_at = 0.0
        self._graced: set[str] = set()  # jobs whose grace was logged (once each)

    def tick(self, now: float | None = None) -> int:
        """Reap if this process's interval has passed and no other worker reaped just now."""
        if clock.monotonic() < self._next_at:
            return 0
        self._next_at = clock.monotonic() + self.interval
        try:
            mine = self.connection.set(keys.REAPER_THROTTLE, self.name, nx=True, px=int(self.interval * 1000))
        except redis.exceptions.ResponseError as exc:
            if is_out_of_memory(exc):
                memory_wait.note_refused()  # its leases' grace counts from here (see reap)
            raise
        memory_wait.note_writes_back()  # the throttle's write was taken
        if not mine:
            return 0
        self.note_refusals(now)
        done = self.reap(now) + self.stop_unheeded_cancels(now) + self.requeue_swallowed(now)
        if self.count_abandoned_calls is not None:
            self.count_abandoned_calls(self.connection, now)
        state_index.backfill_step(self.connection, now=now)  # once per store: jobs older than the indexes
        return done + sum(consistency.sweep(self.connection, now, adopt_requeues=self.adopt_requeues).values())

    def reap(self, now: float | None = None) -> int:
        now = clock.wall() if now is None else now
        due = self.connection.zrangebyscore(keys.LEASES, "-inf", now, start=0, num=BATCH)
        if not due:
            return 0
        by_queue: dict[str, list[str]] = {}
        with self.connection.pipeline(transaction=False) as pipe:
            for raw in due:
                pipe.hmget(keys.job(raw.decode()), "queue", "worker", "lease_expires_at")
            rows = pipe.execute()
        meta = {}
        grace = memory_wait.lease_grace(settings().lease_seconds, now)
        for raw, (queue, worker, expires) in zip(due, rows, strict=True):
            job_id = raw.decode()
            if queue is None:  # the job hash is gone: nothing to reclaim
                self.connection.zrem(keys.LEASES, job_id)
                continue
            if grace is not None and expires is not None and float(expires) >= grace[0] - 1.0:
                self._grant_grace(job_id, grace[1])
                continue
            by_queue.setdefault(queue.decode(), []).append(job_id)
            meta[job_id] = (worker.decode() if worker else None, float(expires) if expires else None)
        reclaimed: dict[str, list[str]] = {}  # new state -> "id (message)"
        for queue_name, job_ids in by_queue.items():
            queue = Queue(queue_name, connection=self.connection)
            lock_key = queue.registry_cleaning_key
            # RQ's maintenance lock, held briefly (RQ's own holder sets 899 s and deletes it).
            if not self.connection.set(lock_key, self.name, nx=True, ex=30):
                continue
            try:
                for job_id in job_ids:
                    worker, expired_at = meta[job_id]
                    message = lease_expired_message(job_id, worker, expired_at, now)
                    new_state = lease.reclaim(self.connection, job_id, queue_name, message, now=now)
                    if new_state is None:
                        continue
                    reclaimed.setdefault(new_state, []).append(f"{job_id} ({message})")
                    if new_state == "failed":
                        release_rate_limit_slot(self.connection, job_id)
                        # Ended: its owner's indexes may now expire with their jobs.
                        state_index.trim_expired(self.connection, lease.owner_of(self.connection, job_id), now)
            finally:
                if self.connection.get(lock_key) == self.name.encode():
                    self.connection.delete(lock_key)
        for new_state, entries in reclaimed.items():  # one line per round: a dead fleet is not 1,000 lines
            log.warning("reclaimed %d job(s) whose lease expired, now %s: %s", len(entries), new_state,
                        summary_of_ids(entries))
        return sum(len(entries) for entries in reclaimed.values())

    def note_refusals(self, now: float | None = None) -> None:
        """Whether Redis refused writes for memory since the last round (of any worker): its own
        count (INFO errorstats) against the one the last round kept. A worker started after
        Redis was full learns so here, before it reaps."""
        now = clock.wall() if now is None else now
        try:
            count = int(self.connection.info("errorstats").get("errorstat_OOM", {}).get("count", 0))
        except redis.exceptions.ResponseError:  # INFO not allowed (a managed plan): what the process saw
            return
        seen, at = self.connection.hmget(keys.REAPER_REFUSALS, "count", "at")
        self.connection.hset(keys.REAPER_REFUSALS, mapping={"count": count, "at": repr(now)})
        if seen is not None and at is not None and count > int(seen):
            memory_wait.note_refused(now, since=float(at))
            memory_wait.note_writes_back(now)  # this round's writes were taken

    def _grant_grace(self, job_id: str, until: float) -> None:
        """A lease that ran out while Redis refused writes is not taken back at once: its
        work-horse holds answers it was paid for and writes them (with its token) as soon as
        writes land. Reclaimed now, another attempt would ask for them again."""
        if job_id not in self._graced:
            self._graced.add(job_id)
            log.info("job %s: its lease ran out while Redis refused writes; its worker has until %s to renew it",
                     job_id, clock.iso(until))
        if len(self._graced) > 10 * BATCH:
            self._graced.clear()

    def stop_unheeded_cancels(self, now: float | None = None) -> int:
        """A cancel is cooperative; if the job did not heartbeat within the grace period,
        fall back to RQ's stop command (SIGKILL of the work-horse)."""
        now = clock.wall() if now is None else now
        due = self.connection.zrangebyscore(keys.CANCELS, "-inf", now, start=0, num=BATCH)
        stopped = 0
        for raw in due:
            job_id = raw.decode()
            self.connection.zrem(keys.CANCELS, job_id)
            if self.connection.hget(keys.job(job_id), "state") != b"running":
                continue
            try:
                send_stop_job_command(self.connection, job_id)
                stopped += 1
                log.warning("job %s ignored its cancel; sent RQ's stop command", job_id)
            except (InvalidJobOperation, NoSuchJobError):
                pass
        return stopped


    def requeue_swallowed(self, now: float | None = None) -> int:
        """A worker killed while blocked in its dequeue can still receive a job (Redis hands
        it to the dead connection's BLMOVE while a child of the worker, its retry scheduler,
        keeps the socket open): the job sits in RQ's intermediate list, never claimed. Put such
        jobs back on their queue without counting an attempt; a waiting batch job's look too,
        which would otherwise wait for RQ's cleanup and then the lost-look sweep."""
        now = clock.wall() if now is None else now
        requeued = 0
        for queue_name in self.queue_names:
            intermediate = IntermediateQueue(keys.rq_queue(queue_name), self.connection)
            for raw in self.connection.lrange(intermediate.key, 0, BATCH - 1):
                job_id = raw.decode()
                state, phase, started_at, looked_at = self.connection.hmget(
                    keys.job(job_id), "state", "phase", "started_at", "looked_at")
                if state != b"queued" and (state, phase) != (b"running", b"waiting"):
                    continue  # claimed (its horse removes it) or not a leash job: RQ's concern
                intermediate.set_first_seen(job_id)
                first_seen = intermediate.get_first_seen(job_id)
                if first_seen is None:
                    continue
                # Time from the job's last claim: a marker set before it belongs to an earlier
                # pass through the list (left by a release that did not clear it on claim, or
                # set by RQ's cleanup in the moment before the claim), not to this one.
                last_claim = max(float(started_at or 0), float(looked_at or 0))
                if first_seen.timestamp() < last_claim:
                    self.connection.delete(intermediate.get_first_seen_key(job_id))
                    intermediate.set_first_seen(job_id)
                    continue
                if now - first_seen.timestamp() < SWALLOWED_AFTER:
                    continue
                requeued += self.requeue_if_swallowed(job_id, queue_name)
        return requeued

    def requeue_if_swallowed(self, job_id: str, queue_name: str,
                             why: str = "taken off by a worker that died before claiming it") -> int:
        """Put a still-unclaimed job from the intermediate list back on its queue (1 if done)."""
        intermediate = IntermediateQueue(keys.rq_queue(queue_name), self.connection)
        done = int(transitions.requeue_swallowed(self.connection, job_id, queue_name, [job_id]))
        if not done:
            return 0
        self.connection.delete(intermediate.get_first_seen_key(job_id))
        if done == 2:  # a waiting batch job's entry whose look RQ already holds again: nothing lost
            log.info("job %s: dropped a stale entry from %s's intermediate list (its look is already due "
                     "through RQ)", job_id, queue_name)
            return 0
        log.warning("job %s was %s; back on %s", job_id, why, queue_name)
        return 1


def release_rate_limit_slot(connection: Redis, job_id: str) -> None:
    try:
        job = Job.fetch(job_id, connection=connection)
    except NoSuchJobError:
        return
    if job.has_rate_limit:
        RateLimitRegistry.from_job(job).release_and_enqueue(job_id)
