"""``LeashWorker``: RQ's forking Worker, with leases.

Lifecycle of one job on this worker (main process = M, work-horse = H):

    M  dequeue (RQ) -> claim (Lua: queued -> running, new fencing token) -> fork
    H  runs jobs.runner.execute; every checkpoint renews the lease; the runner records how
       the attempt ended (finish / fail / release) with fenced writes, then RQ's
       success/failure bookkeeping runs only when leash's write landed
    M  while H runs: every few seconds, heartbeat RQ, reap expired leases (any job), and
       check that this attempt still holds its lease — if not (reclaimed after a hang),
       kill H; its writes would be refused anyway
    M  H died unexpectedly (OOM, SIGKILL): reclaim now (attempt counts) instead of waiting
       for the lease to run out
    SIGTERM (deploy): stop claiming; H checkpoints and releases the job to the front of
       the queue at its next heartbeat (attempt not counted); if H has not done so within
       LEASH_HANDOFF_GRACE seconds, M kills H and releases the job itself. A second SIGTERM
       (1 s or more later: sooner is the same stop said twice) does the same at once.
    Redis unreachable: the worker stays up. RQ's dequeue loop backs off (1, 2, 4 s, capped
       at a few seconds so reaping resumes soon after Redis returns); the other Redis calls of
       the main loop are skipped until then. A job whose work-horse could not write meanwhile
       keeps its lease state in Redis and is reclaimed once the lease has run out.
"""

from __future__ import annotations

import logging

import redis
from rq.exceptions import StopRequested
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.worker import Worker

from jobs import deadletter, keys, runner
from jobs.archive import sweep as archive_sweep
from jobs.config import settings
from jobs.core import clock, lease, retention, state_index
from jobs.core.connection import follow_primary
from jobs.core.lease import Outcome
from jobs.core.outcome import STOPPED_BY_RQ
from jobs.core.reaper import Reaper, release_rate_limit_slot
from jobs.core.rq_side import EXECUTE
from jobs.errors import CANCELED
from jobs.models import backends, cache
from jobs.observability import logs
from jobs.usage import budget
from jobs.webhooks import outbox as webhook_outbox
from jobs.worker import scheduler_locks
from jobs.worker.controls import Controls
from jobs.worker.dequeue import LeashQueue
from jobs.worker.full_redis import FullRedis, refused_for_memory
from jobs.worker.log import log_not_a_failure, quiet_ridden_out_errors
from jobs.worker.rq_job import NoResultStreamJob
from jobs.worker.shutdown import Shutdown, still_running
from jobs.worker.unreadable import Unreadable, func_name

#: What RQ (and so rq-dashboard) records as the "error" of a job canceled through leash.
CANCELED_IN_RQ_VIEW = ("canceled through leash (`leash cancel` or the job page), not an error; "
                       "Requeue runs it again as `leash replay` does, attempts from 0")

log = logging.getLogger("leash.worker")

REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class LeashJob(NoResultStreamJob):
    """An RQ job run under its worker's claimed attempt (``jobs.runner.execute``; a plain ``rq worker`` has none)."""

    attempt: lease.Attempt | None = None

    def _execute(self):
        if self.func_name == EXECUTE:
            return runner.execute(*self.args, attempt=self.attempt)
        return super()._execute()


class LeashWorker(Controls, Unreadable, Shutdown, FullRedis, Worker):
    queue_class = LeashQueue  # every dequeue goes through an intermediate list (dequeue.py)
    job_class = LeashJob
    # RQ doubles its wait up to 60 s while Redis is down; this worker reaps for all: back within seconds.
    max_connection_wait_time = 5.0
    _cache_swept_at = float("-inf")
    scheduler_check_seconds = 5.0

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("serializer", JSONSerializer)
        # Wake often enough to notice an expired lease well inside its length.
        self.tick_seconds = max(0.25, min(5.0, settings().lease_seconds / 4))
        super().__init__(*args, **kwargs)
        if problem := backends.preload():
            log.warning("%s: model jobs on this worker will fail until it is fixed", problem)
        self.job_monitoring_interval = max(1, int(self.tick_seconds))
        self.reaper = Reaper(self.connection, self.name, self.tick_seconds, tuple(self.queue_names()),
                             adopt_requeues=deadletter.adopt_requeues, count_abandoned_calls=budget.sweep_reservations)
        self._attempt: lease.Attempt | None = None
        logs.add_context_provider(self._log_context)
        quiet_ridden_out_errors()  # a failover or restart ridden out logs WARNINGs, not RQ's ERRORs
        self._handoff_deadline: float | None = None
        self._scheduler_checked_at = 0.0

    @property
    def dequeue_timeout(self) -> int:
        # RQ blocks for worker_ttl - 15 = 405 s; an idle worker must keep reaping.
        return max(1, int(self.tick_seconds))

    # --- periodic work in the main process -------------------------------------------

    def heartbeat(self, timeout=None, pipeline=None):
        if pipeline is not None or self.is_horse:
            return super().heartbeat(timeout, pipeline)
        try:
            super().heartbeat(timeout, pipeline)
        except REDIS_DOWN as exc:
            # Not fatal: the dequeue that follows waits for Redis with backoff.
            log.warning("Redis unreachable, heartbeat skipped: %s", exc)
            return
        self._follow_primary()
        self._tick()
        self._restart_dead_scheduler()

    def maintain_heartbeats(self, job: Job, execution):
        try:
            super().maintain_heartbeats(job, execution)
        except REDIS_DOWN as exc:
            log.warning("Redis unreachable while job %s runs: %s", job.id, exc)
            return
        self._tick()
        self._check_current_attempt()

    def check_for_suspension(self, burst: bool):
        try:
            super().check_for_suspension(burst)
        except REDIS_DOWN:
            pass  # the dequeue that follows waits for Redis with backoff

    def set_state(self, state, pipeline=None):
        if pipeline is not None:
            return super().set_state(state, pipeline)
        try:
            super().set_state(state)
        except REDIS_DOWN:
            self._state = state  # only what `rq info` shows: not worth stopping the worker for

    def run_maintenance_tasks(self):
        try:
            super().run_maintenance_tasks()
        except REDIS_DOWN as exc:
            log.warning("Redis unreachable, maintenance postponed: %s", exc)

    def _restart_dead_scheduler(self) -> None:
        """RQ restarts a dead scheduler (retry backoff) only in maintenance, every 10 minutes;
        check more often (an outage killed it, or its lock's worker died), but not in shutdown."""
        if self.scheduler is None or self.scheduler.closed or self._shutdown_requested_date is not None:
            return
        if clock.monotonic() - self._scheduler_checked_at < self.scheduler_check_seconds:
            return
        self._scheduler_checked_at = clock.monotonic()
        process = self.scheduler._process
        if process is None or not process.is_alive():
            try:
                released = scheduler_locks.release_if_holder_dead(
                    self.connection, self.queue_names(), full_ttl=self.scheduler.interval + 60)
                if released:
                    log.warning("released the retry scheduler lock of a dead scheduler: %s", ", ".join(released))
                self.scheduler.acquire_locks(auto_start=True)
            except redis.exceptions.RedisError as exc:
                if not self.noted_full(exc):
                    log.warning("scheduler not restarted: %s", exc)

    def _follow_primary(self) -> None:
        """Behind Sentinel, talk to the current primary (jobs/core/connection.py). When no
        Sentinel names one, the Redis calls that follow wait or fail as in any outage."""
        try:
            follow_primary(self.connection)
        except REDIS_DOWN as exc:
            log.warning("no primary from the Sentinels: %s", exc)

    def _tick(self) -> None:
        try:
            self.reaper.tick()
            archive_sweep.tick(self.connection)  # ended jobs to SQL; an unreachable archive is logged
            webhook_outbox.tick(self.connection)  # ended jobs' webhooks: an RQ job each (jobs/webhooks/)
            if clock.monotonic() >= self._cache_swept_at + cache.SWEEP_EVERY:
                self._cache_swept_at = clock.monotonic()
                cache.sweep(self.connection)  # expired answers leave the request cache's index
        except redis.exceptions.RedisError as exc:
            if not self.noted_full(exc):
                log.warning("reaper skipped a round: %s", exc)

    def _check_current_attempt(self) -> None:
        attempt = self._attempt
        if attempt is None or not self.horse_pid:
            return
        if self._handoff_deadline is not None and clock.monotonic() > self._handoff_deadline:
            log.warning("job %s did not hand off within the grace period; stopping it", attempt.job_id)
            return self.kill_horse()
        try:
            state, token, phase = self.connection.hmget(keys.job(attempt.job_id), "state", "token", "phase")
        except redis.exceptions.RedisError:
            return
        if phase == b"waiting":
            return  # the work-horse parked the batch job (a new token) and is finishing RQ's bookkeeping
        if state != b"running" or (token or b"").decode() != attempt.token:
            if self._handoff_deadline is not None:
                # Handing off: the work-horse has just released the job and is finishing up (or, if
                # it was reclaimed, learns so at its next heartbeat); the grace deadline bounds it.
                return
            # A work-horse back from an outage first writes the usage and answers it was paid for.
            if clock.monotonic() - attempt.__dict__.setdefault("reclaimed_at", clock.monotonic()) < 5.0:
                return
            log.warning("job %s was reclaimed from this worker; stopping its work-horse", attempt.job_id)
            attempt.settle(Outcome.SUPERSEDED)
            self.kill_horse()

    # --- claiming ----------------------------------------------------------------------

    def execute_job(self, job: Job, queue: Queue):
        try:
            self._execute_job(job, queue)
        except REDIS_DOWN as exc:
            # Never leave a work-horse unsupervised: the lease in Redis gets the job reclaimed.
            log.warning("lost Redis while handling job %s: %s; reclaimed once Redis answers", job.id, exc)
            if self.horse_pid and still_running(self.horse_pid):
                self.kill_horse()
                self.wait_for_horse()
        except redis.exceptions.ResponseError as exc:
            # Redis full while RQ recorded the job's start or end in this process: the job's
            # own writes wait in its work-horse; what is left is the lease's to settle.
            if not self.noted_full(exc):
                raise
            log.info("job %s: RQ's bookkeeping refused for memory; its lease settles it", job.id)

    def _execute_job(self, job: Job, queue: Queue):
        if (name := func_name(job)) is None:
            return self.fail_unreadable(job, queue)  # another serializer: failed as RQ fails it
        if name != EXECUTE:
            return super().execute_job(job, queue)  # a plain RQ job on this queue
        if self._stop_requested:
            # The stop came while this job was being taken and its StopRequested was swallowed
            # (Shutdown.request_stop): the job goes back to the front of its queue, unclaimed.
            self.reaper.requeue_if_swallowed(job.id, queue.name, why="taken by a worker that was stopping")
            raise StopRequested()
        if self._turned_back(job, queue):  # taken while this worker went quiet or its queue paused
            return
        # The work-horse asks the Sentinels afresh when it connects: claim where it will write.
        self._follow_primary()
        attempt = self._claim(job, queue)
        if attempt is None:
            self._not_claimable(job, queue)
            return
        attempt.owner = str((job.meta or {}).get("leash_owner") or "")
        self._attempt = attempt  # the work-horse forked below runs it (LeashJob)
        try:
            super().execute_job(job, queue)
        except StopRequested:
            # SIGTERM between the claim and the fork (RQ only defers a stop once it is busy):
            # nothing ran, so the claim goes back at once, like any hand-off.
            if not self.horse_pid:
                self._drop_idle_connections()  # the signal may have cut a command off (teardown)
                attempt.release()
            raise
        finally:
            self._attempt = None
            self._expire_owner_index(attempt)

    def _expire_owner_index(self, attempt: lease.Attempt) -> None:
        """The job ended or went back: its keys (RQ's too) and its owner's indexes may expire."""
        try:
            retention.retain(self.connection, attempt.job_id)
            state_index.trim_expired(self.connection, attempt.owner_name())
        except redis.exceptions.RedisError as exc:
            if not self.noted_full(exc):  # the next ended job of the owner trims it
                log.warning("owner index of job %s not trimmed: %s", attempt.job_id, exc)

    def _claim(self, job: Job, queue: Queue) -> lease.Attempt | None:
        """Claim the job, waiting while Redis is full (it stays in this worker's intermediate
        list meanwhile; a stop leaves it there for the reaper to give back)."""
        while True:
            try:
                attempt = lease.claim(self.connection, job.id, queue.name, self.name)
            except redis.exceptions.ResponseError as exc:
                if not refused_for_memory(exc):
                    raise
                self.wait_for_memory(exc)
                continue
            self.memory_wait.accepted()
            return attempt

    def _log_context(self) -> dict:
        return logs.attempt_context(self._attempt)

    @property
    def attempt(self) -> lease.Attempt | None:
        """The attempt this worker (or its work-horse) runs now, if any."""
        return self._attempt

    def perform_job(self, job: Job, queue: Queue, execution) -> bool:
        attempt = self._attempt
        if isinstance(job, LeashJob):
            job.attempt = attempt
        if attempt is not None and execution is not None:
            attempt.rq_started_member = execution.composite_key
        return super().perform_job(job, queue, execution)

    # --- how an attempt ends, in RQ's terms -------------------------------------------

    def handle_job_success(self, job, queue, started_job_registry, execution):
        attempt = self._attempt
        if attempt is not None and attempt.outcome != Outcome.SUCCEEDED:
            return self._forget_execution(job, execution)
        return super().handle_job_success(job, queue, started_job_registry, execution)

    def handle_job_failure(self, job, queue, started_job_registry=None, exc_string="", execution=None):
        attempt = self._attempt
        if (name := func_name(job)) is None:  # RQ's maintenance failing an entry it cannot read
            return self.fail_unreadable(job, queue, started_job_registry, execution)
        if attempt is None and name == EXECUTE:
            # RQ's maintenance (its intermediate-list cleanup) failing a leash job that no attempt
            # holds: it never started, so it goes back to its queue; leash, not RQ, decides fates.
            log.warning("RQ reported leash job %s stuck (%s); requeueing it instead", job.id, exc_string)
            self.reaper.requeue_if_swallowed(job.id, queue.name)
            return None
        if attempt is None:
            return super().handle_job_failure(job, queue, started_job_registry, exc_string, execution)
        if self.is_horse:
            if attempt.outcome is None:  # something escaped the runner (BaseException)
                attempt.fail(lease.truncate(exc_string or "work-horse failed"), permanent=False)
        elif attempt.outcome is None:
            self._settle_dead_horse(attempt, job, exc_string)

        if attempt.outcome == Outcome.RETRY:
            job.retries_left = max(1, attempt.extra.get("attempts_left", 1))
            return super().handle_job_failure(job, queue, started_job_registry, exc_string, execution)
        if attempt.outcome == Outcome.FAILED:
            job.retries_left = 0
            # A cancel is not an error: rq-dashboard shows this line, not the traceback of the
            # exception that stopped the job, and its Requeue is a replay (consistency).
            try:
                if self.connection.hget(keys.job(job.id), "error") == CANCELED.encode():
                    exc_string = CANCELED_IN_RQ_VIEW
            except REDIS_DOWN:
                pass  # RQ's own handling below meets the same outage; the text is a nicety
            return super().handle_job_failure(job, queue, started_job_registry, exc_string, execution)
        # superseded, handed off or reclaimed: leash's Lua already put RQ's side right.
        self._stopped_job_id = None
        return self._forget_execution(job, execution)

    def _settle_dead_horse(self, attempt: lease.Attempt, job: Job, exc_string: str) -> None:
        """The work-horse ended without recording how (killed). Decide in the main process."""
        if self._stopped_job_id == job.id:  # RQ's stop command: leash's own cancel sends it past its grace
            asked = self.connection.hget(keys.job(job.id), "cancel_requested") == b"1"
            attempt.fail(CANCELED if asked else STOPPED_BY_RQ, permanent=True)
        elif self._handoff_deadline is not None:
            attempt.release()
            log_not_a_failure(attempt, None, how="after the grace period")
        else:
            message = f"worker process died: {exc_string.strip() or 'no exit status'}"
            new_state = attempt.abandon(message)
            attempt.settle(Outcome.RECLAIMED if new_state else Outcome.SUPERSEDED)
            if new_state == "failed":
                release_rate_limit_slot(self.connection, job.id)
            elif new_state is None:
                # The horse may have recorded its failure and died before RQ's bookkeeping:
                # finish that bookkeeping here so the job does not wait for RQ's sweep.
                landed = attempt.landed("queued", "failed")
                if landed and job.get_status(refresh=True) == JobStatus.STARTED:
                    attempt.settle(Outcome.RETRY if landed[0] == "queued" else Outcome.FAILED)
                    attempt.extra["attempts_left"] = landed[2] - landed[1]

    def _forget_execution(self, job: Job, execution) -> None:
        with self.connection.pipeline() as pipe:
            self.cleanup_execution(job, pipeline=pipe, execution=execution)
            pipe.execute()

    def handle_exception(self, job: Job, *exc_info):
        # In the work-horse: RQ logs every exception a job raised as an ERROR with its traceback. An attempt
        # that gave its job back (hand-off, Redis blip) or lost its lease did not fail: one line, no alert.
        attempt = self._attempt
        if attempt is not None and log_not_a_failure(attempt, exc_info[1]):
            return
        super().handle_exception(job, *exc_info)

