"""The operator's switches, on the worker's side (jobs/core/switches.py has the records).

A mixin of ``LeashWorker``, with what a worker does with the entries it took off a queue and
does not run (a job it may not claim) and with the claim's end of RQ's intermediate list:

    quiet            ``leash quiet`` (RQ's pubsub command, and the record in Redis read before
                     every dequeue) or SIGTSTP, as Sidekiq's TSTP: the job running goes on to
                     its end; then the worker takes nothing, keeps beating and reaping for the
                     others (RQ shows it suspended), and stops at SIGTERM as ever. Quiet is one
                     way: a worker is made busy again by starting it again.
    a paused queue   LeashQueue leaves it out of every dequeue (jobs/worker/dequeue.py)
    either, late     a job taken while the switch was thrown (the worker was already waiting in
                     its dequeue) goes back to the front of its queue unclaimed, attempt not
                     counted: "quiet" and "paused" mean no job starts, not "fewer jobs start"
"""

from __future__ import annotations

import logging
import signal
import time

import redis
from rq.command import parse_payload
from rq.exceptions import InvalidJobOperation, StopRequested
from rq.intermediate_queue import IntermediateQueue
from rq.worker import WorkerStatus

from jobs import keys
from jobs.core import clock, retention, switches
from jobs.core.upkeep import consistency
from jobs.lifecycle import transitions

log = logging.getLogger("leash.worker")


def _first_seen_key(queue_name: str, job_id: str, connection) -> str:
    """RQ's marker of when it first saw the job in its intermediate list (RQ's cleanup and the
    reaper's swallowed-job check time from it): it leaves when the job is claimed."""
    return IntermediateQueue(keys.rq_queue(queue_name), connection).get_first_seen_key(job_id)


class Controls:
    _quiet_since: float | None = None
    _quiet_asked: str | None = None  # by a signal or a pubsub command, not yet recorded in Redis

    def _install_signal_handlers(self):
        super()._install_signal_handlers()
        signal.signal(signal.SIGTSTP, self._quiet_signal)

    def _quiet_signal(self, signum, frame):
        # Only a flag: the main loop records it (a Redis call inside a signal handler could cut
        # into one the loop is making). Ctrl+Z reaches the work-horse too, which runs on.
        if not self.is_horse:
            self._quiet_asked = "SIGTSTP"

    def handle_payload(self, message):
        # RQ's worker commands arrive on its pubsub thread; leash adds one of its own.
        if parse_payload(message).get("command") == switches.QUIET_COMMAND:
            self._quiet_asked = "leash quiet"
            return
        super().handle_payload(message)

    @property
    def is_quiet(self) -> bool:
        return self._quiet_since is not None or self._quiet_asked is not None

    def _note_quiet(self, since: float | None = None) -> None:
        """Read (or record) the quiet switch; log once when it is first thrown."""
        if self._quiet_since is not None:
            return
        try:
            if self._quiet_asked is not None:
                self.connection.hsetnx(keys.QUIET, self.name, clock.wall())
            since = switches.quiet_since(self.connection, self.name) if since is None else since
        except redis.exceptions.RedisError:
            return  # the next look records it; meanwhile the asked flag keeps it quiet
        if since is None:
            return
        self._quiet_since = since
        log.info("worker %s is quiet (%s): it finishes its job and takes no new one", self.name,
                 self._quiet_asked or "leash quiet")

    def check_for_suspension(self, burst: bool):
        super().check_for_suspension(burst)  # RQ's own `rq suspend`, all workers at once
        self._note_quiet()
        if not self.is_quiet:
            return
        if burst:
            raise StopRequested()  # a burst worker told to be quiet has nothing left to do
        self.set_state(WorkerStatus.SUSPENDED)
        while not self._stop_requested:
            self.heartbeat()  # alive for RQ, and the reaper's rounds go on (LeashWorker.heartbeat)
            self._note_quiet()
            time.sleep(self.tick_seconds)
        raise StopRequested()

    def _turned_back(self, job, queue) -> bool:
        """Give back, unclaimed, a job taken while this worker was quiet or its queue paused."""
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                pipe.hget(keys.QUIET, self.name)
                pipe.hexists(keys.PAUSED, queue.name)
                quiet, paused = pipe.execute()
        except redis.exceptions.RedisError:
            return False  # as before the switches: the claim that follows meets the same Redis
        if quiet is not None:
            self._note_quiet(float(quiet))
        if not self.is_quiet and not paused:
            return False
        done = int(transitions.requeue_swallowed(self.connection, job.id, queue.name, [job.id]))
        self.connection.delete(_first_seen_key(queue.name, job.id, self.connection))
        why = "this worker is quiet" if self.is_quiet else f"{queue.name} is paused"
        if done == 1:
            log.info("job %s went back to the front of %s unclaimed: %s", job.id, queue.name, why)
        return True

    # --- entries taken that this worker does not run ----------------------------------

    def _not_claimable(self, job, queue) -> None:
        """A queue entry for a job leash cannot claim: a failed job requeued with RQ's tools
        (replayed now, through its owner's limit), or a duplicate entry for a job running
        elsewhere or already ended (dropped)."""
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            pipe.delete(_first_seen_key(queue.name, job.id, self.connection))
            pipe.execute()
        state, ended_at = self.connection.hmget(keys.job(job.id), "state", "ended_at")
        state = (state or b"missing").decode()
        try:
            rq_status = getattr(job.get_status(refresh=True), "value", None)
        except InvalidJobOperation:  # RQ's record is gone too (deleted, or lost in a failover)
            rq_status = None
        if consistency.requeued_by_rq(state, rq_status, float(ended_at) if ended_at else None, clock.wall()):
            # jobs.deadletter.adopt_requeues, handed to the reaper by the worker (a layer above)
            if self.reaper.adopt_requeues(self.connection, [job.id], source="rq requeue"):
                return
        retention.retain(self.connection, job.id)  # an ended job's RQ record goes with it
        log.info("job %s is not claimable (%s); dropped this queue entry", job.id, state)

    def prepare_job_execution(self, job, remove_from_intermediate_queue: bool = False) -> None:
        # RQ removes the job from its intermediate list only for one-queue workers; LeashQueue
        # uses that list for any number of queues.
        super().prepare_job_execution(job, remove_from_intermediate_queue=True)
        # Claimed: the "first seen" marker of this pass through the list goes too, or the job's
        # next pass (a batch job's next look, a retry) would look swallowed at once (24-h marker).
        self.connection.delete(_first_seen_key(job.origin, job.id, self.connection))

    def set_state(self, state, pipeline=None):
        changed = state != getattr(self, "_state", None)
        super().set_state(state, pipeline)
        if changed and not self.is_horse:
            # Since when the worker is busy, idle or suspended (`leash workers`), in its own hash.
            try:
                (pipeline if pipeline is not None else self.connection).hset(
                    self.key, "leash_state_since", clock.wall())
            except redis.exceptions.RedisError:
                pass  # only what `leash workers` shows

    def teardown(self):
        if not self.is_horse:
            try:
                switches.forget_worker(self.connection, self.name)
            except redis.exceptions.RedisError:
                pass  # a record of a gone worker is dropped by the next `leash workers`
        super().teardown()
