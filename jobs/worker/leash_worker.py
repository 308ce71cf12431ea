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
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.worker import Worker

from jobs import deadletter, runner
from jobs.archive import database, webhook_log
from jobs.config import settings
from jobs.core import lease, retention, state_index
from jobs.core.lease import Outcome
from jobs.core.rq_side import EXECUTE
from jobs.core.upkeep.reaper import Reaper
from jobs.models import backends
from jobs.observability import logs
from jobs.usage import budget
from jobs.webhooks import delivery
from jobs.worker.chores import Chores
from jobs.worker.controls import Controls
from jobs.worker.dequeue import LeashQueue
from jobs.worker.endings import failed_text, settle_dead_horse
from jobs.worker.full_redis import FullRedis, refused_for_memory
from jobs.worker.log import REDIS_DOWN, log_not_a_failure, quiet_ridden_out_errors
from jobs.worker.rq_job import NoResultStreamJob
from jobs.worker.shutdown import Shutdown, still_running
from jobs.worker.unreadable import Unreadable, func_name

log = logging.getLogger("leash.worker")


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
        delivery.to_archive = _webhook_attempt_to_archive  # every webhook attempt, kept past its record's log
        self._handoff_deadline: float | None = None
        self.chores = Chores(self.connection, self.reaper, self.noted_full)

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
        self.chores.follow_primary()
        self.chores.tick()
        if self._shutdown_requested_date is None:
            self.chores.restart_dead_scheduler(self.scheduler, self.queue_names())

    def maintain_heartbeats(self, job: Job, execution):
        try:
            super().maintain_heartbeats(job, execution)
        except REDIS_DOWN as exc:
            log.warning("Redis unreachable while job %s runs: %s", job.id, exc)
            return
        self.chores.tick()
        attempt = self._attempt
        if attempt is not None and self.horse_pid and self.chores.horse_must_stop(attempt, self._handoff_deadline):
            self.kill_horse()

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
        self.chores.follow_primary()
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
            settle_dead_horse(self.connection, attempt, job, exc_string, stopped=self._stopped_job_id == job.id,
                              handing_off=self._handoff_deadline is not None)

        if attempt.outcome == Outcome.RETRY:
            job.retries_left = max(1, attempt.extra.get("attempts_left", 1))
            return super().handle_job_failure(job, queue, started_job_registry, exc_string, execution)
        if attempt.outcome == Outcome.FAILED:
            job.retries_left = 0
            exc_string = failed_text(self.connection, job.id, exc_string)
            return super().handle_job_failure(job, queue, started_job_registry, exc_string, execution)
        # superseded, handed off or reclaimed: leash's Lua already put RQ's side right.
        self._stopped_job_id = None
        return self._forget_execution(job, execution)

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


def _webhook_attempt_to_archive(connection, job_id: str, delivery_id: str, entry: dict) -> None:
    """One webhook attempt in the archive of ``connection``'s jobs, when there is one."""
    webhook_log.record(database.engine_for(connection), job_id, delivery_id, entry)
