"""The main process's chores, between jobs and while one runs (called from ``LeashWorker``'s
heartbeats, jobs/worker/leash_worker.py): reap expired leases (any job's), archive ended jobs, queue
their webhooks, sweep the request cache, follow the Redis primary behind Sentinel, restart a dead
retry scheduler; and watch that the attempt a work-horse runs still holds its lease.

A chore that meets an unreachable or full Redis is skipped with a warning and done at the next
heartbeat: the worker stays up through an outage."""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis

from jobs import keys
from jobs.archive import sweep as archive_sweep
from jobs.core import clock, lease
from jobs.core.lease import Outcome
from jobs.core.store.connection import follow_primary
from jobs.intake import deployed_model as deployment
from jobs.models import cache
from jobs.webhooks import outbox as webhook_outbox
from jobs.worker import scheduler_locks
from jobs.worker.log import REDIS_DOWN

log = logging.getLogger("leash.worker")

#: Seconds a work-horse whose job was reclaimed gets to write the usage and answers it was paid for.
RECLAIMED_GRACE = 5.0


class Chores:
    """One worker's chores. ``noted_full(exc)`` is True when Redis refused a write for memory
    (the worker's wait for room logs that once)."""

    scheduler_check_seconds = 5.0

    def __init__(self, connection, reaper, noted_full: Callable[[BaseException], bool]):
        self.connection = connection
        self.reaper = reaper
        self.noted_full = noted_full
        self._cache_swept_at = float("-inf")
        self._published_at = float("-inf")
        self._scheduler_checked_at = 0.0

    def tick(self) -> None:
        try:
            self.reaper.tick()
            archive_sweep.tick(self.connection)  # ended jobs to SQL; an unreachable archive is logged
            webhook_outbox.tick(self.connection)  # ended jobs' webhooks: an RQ job each (jobs/webhooks/)
            if clock.monotonic() >= self._published_at + deployment.EVERY_SECONDS:
                self._published_at = clock.monotonic()  # the model settings the doors price with
                deployment.publish(self.connection, list(self.reaper.queue_names), self.reaper.name)
            if clock.monotonic() >= self._cache_swept_at + cache.SWEEP_EVERY:
                self._cache_swept_at = clock.monotonic()
                cache.sweep(self.connection)  # expired answers leave the request cache's index
        except redis.exceptions.RedisError as exc:
            if not self.noted_full(exc):
                log.warning("reaper skipped a round: %s", exc)

    def follow_primary(self) -> None:
        """Behind Sentinel, talk to the current primary (jobs/core/store/connection.py). When no
        Sentinel names one, the Redis calls that follow wait or fail as in any outage."""
        try:
            follow_primary(self.connection)
        except REDIS_DOWN as exc:
            log.warning("no primary from the Sentinels: %s", exc)

    def restart_dead_scheduler(self, scheduler, queue_names: list[str]) -> None:
        """RQ restarts a dead scheduler (retry backoff) only in maintenance, every 10 minutes;
        check more often (an outage killed it, or its lock's worker died). Not called in shutdown."""
        if scheduler is None or scheduler.closed:
            return
        if clock.monotonic() - self._scheduler_checked_at < self.scheduler_check_seconds:
            return
        self._scheduler_checked_at = clock.monotonic()
        process = scheduler._process
        if process is None or not process.is_alive():
            try:
                released = scheduler_locks.release_if_holder_dead(
                    self.connection, queue_names, full_ttl=scheduler.interval + 60)
                if released:
                    log.warning("released the retry scheduler lock of a dead scheduler: %s", ", ".join(released))
                scheduler.acquire_locks(auto_start=True)
            except redis.exceptions.RedisError as exc:
                if not self.noted_full(exc):
                    log.warning("scheduler not restarted: %s", exc)

    def horse_must_stop(self, attempt: lease.Attempt, handoff_deadline: float | None) -> bool:
        """Whether the work-horse running ``attempt`` must be killed: it did not hand off within the
        grace period, or its job was reclaimed from this worker (its writes would be refused anyway)."""
        if handoff_deadline is not None and clock.monotonic() > handoff_deadline:
            log.warning("job %s did not hand off within the grace period; stopping it", attempt.job_id)
            return True
        try:
            state, token, phase = self.connection.hmget(keys.job(attempt.job_id), "state", "token", "phase")
        except redis.exceptions.RedisError:
            return False
        if phase == b"waiting":
            return False  # the work-horse parked the batch job (a new token) and is finishing RQ's bookkeeping
        if state == b"running" and (token or b"").decode() == attempt.token:
            return False
        if handoff_deadline is not None:
            # Handing off: the work-horse has just released the job and is finishing up (or, if
            # it was reclaimed, learns so at its next heartbeat); the grace deadline bounds it.
            return False
        # A work-horse back from an outage first writes the usage and answers it was paid for.
        if clock.monotonic() - attempt.__dict__.setdefault("reclaimed_at", clock.monotonic()) < RECLAIMED_GRACE:
            return False
        log.warning("job %s was reclaimed from this worker; stopping its work-horse", attempt.job_id)
        attempt.settle(Outcome.SUPERSEDED)
        return True
