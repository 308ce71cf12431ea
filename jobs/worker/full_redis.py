"""How ``leash worker``'s main process rides out a full Redis (``maxmemory``, ``noeviction``).

RQ's work loop quits on any error it does not know, and a refused write ("OOM command not
allowed") is one: every worker used to exit about 2 s after Redis filled up, leaving its
running job to wait for a restart. Here each write of the main loop that Redis refuses for
memory is skipped or retried with backoff (``jobs.core.store.memory_wait``): the heartbeat and RQ's
maintenance are skipped until writes land again, the dequeue and the claim wait. The running
job's own writes wait in its work-horse (``jobs.core.lease.Attempt._run``), so once memory is freed
its checkpoints and its end land, or, if its lease ran out meanwhile, it is reclaimed.
"""

from __future__ import annotations

import logging
import time

import redis
from rq.exceptions import StopRequested

from jobs.core.store.connection import is_out_of_memory
from jobs.core.store.memory_wait import MemoryWait

log = logging.getLogger("leash.worker")


def refused_for_memory(exc: BaseException) -> bool:
    return isinstance(exc, redis.exceptions.ResponseError) and is_out_of_memory(exc)


class FullRedis:
    """Mixed into ``LeashWorker`` before RQ's ``Worker``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.memory_wait = MemoryWait(log, f"worker {self.name}")

    def noted_full(self, exc: BaseException) -> bool:
        """True (and noted, quietly after the first) if ``exc`` is a write refused for memory."""
        if refused_for_memory(exc):
            self.memory_wait.refused(exc)
            return True
        return False

    def heartbeat(self, timeout=None, pipeline=None):
        if pipeline is not None or self.is_horse:
            return super().heartbeat(timeout, pipeline)
        try:
            super().heartbeat(timeout, pipeline)
        except redis.exceptions.ResponseError as exc:
            if not self.noted_full(exc):
                raise
            return None
        self.memory_wait.accepted()
        return None

    def maintain_heartbeats(self, job, execution):
        try:
            super().maintain_heartbeats(job, execution)
        except redis.exceptions.ResponseError as exc:
            if not self.noted_full(exc):
                raise

    def check_for_suspension(self, burst: bool):
        try:
            super().check_for_suspension(burst)  # RQ heartbeats here: a write
        except redis.exceptions.ResponseError as exc:
            if not self.noted_full(exc):
                raise

    def set_state(self, state, pipeline=None):
        try:
            super().set_state(state, pipeline)
        except redis.exceptions.ResponseError as exc:
            if pipeline is not None or not self.noted_full(exc):
                raise
            self._state = state  # only what `rq info` shows

    def run_maintenance_tasks(self):
        try:
            super().run_maintenance_tasks()
        except redis.exceptions.ResponseError as exc:
            if not self.noted_full(exc):
                raise

    def prepare_job_execution(self, job, remove_from_intermediate_queue: bool = False) -> None:
        # In the work-horse, before the job runs: RQ's one transaction (all or nothing) that
        # records its start. Refused, RQ would end the work-horse before the job ran a step.
        while True:
            try:
                super().prepare_job_execution(job, remove_from_intermediate_queue)
            except redis.exceptions.ResponseError as exc:
                if not refused_for_memory(exc):
                    raise
                time.sleep(self.memory_wait.refused(exc))
                continue
            self.memory_wait.accepted()
            return

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        # Taking a job off its queue is a write (LMOVE): wait for memory, then take it.
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except redis.exceptions.ResponseError as exc:
                if not refused_for_memory(exc):
                    raise
                self.wait_for_memory(exc)

    def wait_for_memory(self, exc: BaseException) -> None:
        """Sleep the backoff; a stop requested meanwhile ends the wait (and the loop)."""
        time.sleep(self.memory_wait.refused(exc))
        if self._stop_requested:
            raise StopRequested()
