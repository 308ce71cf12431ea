"""What a worker does with a job RQ cannot read, and how it says it died.

A leash queue's jobs are stored with RQ's JSONSerializer. A plain RQ job enqueued there with
another serializer (RQ's default pickles: ``q.enqueue(f)``, and RQ 3.0's ``rq cron`` enqueues
every job that way) cannot even be asked which function it runs. RQ's own loop would meet that
as an unhandled exception and quit with status 0, leaving the entry in its intermediate list
for RQ's start-up maintenance to trip on in every later worker. Here such a job is failed as RQ
fails a job (its failed registry, rq-dashboard), with an error naming the cause and the fix, and
the worker goes on; a worker that does quit on an unhandled exception says so (``died``) and
``leash worker`` exits 1, so a supervisor that restarts on failure restarts it.
"""

from __future__ import annotations

import logging

from rq.exceptions import DeserializationError
from rq.job import Job
from rq.queue import Queue
from rq.worker import Worker

log = logging.getLogger("leash.worker")

#: The error RQ records for a job this worker cannot read (RQ's failed registry, rq-dashboard).
UNREADABLE = ("leash cannot read this job: it was not enqueued with RQ's JSONSerializer, the serializer of every "
              "leash queue (RQ's default pickles: `q.enqueue(f)` without serializer=JSONSerializer, and every "
              "`rq cron` job). Enqueue plain RQ jobs for a leash queue with `Queue(name, connection=..., "
              "serializer=JSONSerializer)`, or put them on a queue a plain `rq worker` serves")


def func_name(job: Job) -> str | None:
    """The function a job runs, or None when RQ cannot read the job (another serializer)."""
    try:
        return job.func_name
    except DeserializationError:
        return None


class _Deaths(logging.Filter):
    """Notes RQ's loop quitting on an exception (it logs it at ERROR, then returns as if done)."""

    def __init__(self):
        super().__init__()
        self.last: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "quitting" in str(record.msg):
            self.last = record.getMessage()
        return True


class Unreadable:
    """Mixed into LeashWorker (an RQ Worker)."""

    _deaths: _Deaths | None = None

    def work(self, *args, **kwargs):
        self._deaths = _Deaths()
        self.log.addFilter(self._deaths)
        try:
            return super().work(*args, **kwargs)
        finally:
            self.log.removeFilter(self._deaths)

    @property
    def died(self) -> str | None:
        """Why the last ``work()`` quit on an error rather than on request or in burst mode."""
        return self._deaths.last if self._deaths else None

    def fail_unreadable(self, job: Job, queue: Queue, started_job_registry=None, execution=None) -> None:
        """Fail the job as RQ fails one, in RQ's failed registry with the cause and the fix as
        its error; never retried (no attempt can read it either)."""
        log.error("job %s on queue %s: %s", job.id, queue.name, UNREADABLE)
        job.retries_left = 0
        self.connection.lrem(queue.intermediate_queue_key, 1, job.id)
        Worker.handle_job_failure(self, job, queue, started_job_registry, UNREADABLE, execution)
