"""A warm stop that something swallowed. RQ stops an idle worker by raising StopRequested out
of its signal handler, wherever the loop is; code that catches every Exception loses it —
logging's handlers do (they print "--- Logging error ---" and go on). The worker must still
stop, and must not start a job it took off the queue meanwhile.

In-process, on a real Redis: the stop is requested from inside the worker's own code, at the
exact spot a signal can land, which a real signal can only hit by chance."""

from __future__ import annotations

import contextlib
import io
import logging
import signal
import sys
import time

import pytest
from rq.exceptions import StopRequested

from jobs import keys
from jobs.core import states
from jobs.core.store.connection import connect
from jobs.enqueue import enqueue
from jobs.worker.dequeue import LeashQueue
from jobs.worker.leash_worker import LeashWorker
from tests.conftest import REDIS_URL


@pytest.fixture
def worker(conn):
    """A LeashWorker in this process; the signal handlers it installs are put back after."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    built = LeashWorker(["leash"], connection=connect(REDIS_URL))
    try:
        yield built
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


class StopWhileWriting(io.StringIO):
    """A log stream that delivers a stop to the worker while it writes the line ``marker``."""

    def __init__(self, worker, marker: str):
        super().__init__()
        self.worker, self.marker, self.stopped = worker, marker, False

    def write(self, text):
        if self.marker in text and not self.stopped:
            self.stopped = True
            self.worker.request_stop(signal.SIGTERM, sys._getframe())  # what the signal handler gets
        return super().write(text)


def test_a_stop_that_lands_in_a_log_line_still_stops_the_idle_worker_at_once(worker, capsys):
    stream = StopWhileWriting(worker, "cleaning registries")  # the first line of the loop's maintenance
    handler = logging.StreamHandler(stream)
    rq_log = logging.getLogger("rq.worker")
    rq_log.addHandler(handler)
    rq_log.setLevel(logging.INFO)
    try:
        began = time.monotonic()
        # Bounded either way: an idle worker that lost its stop quits after 6 s idle.
        worker.work(burst=False, with_scheduler=False, max_idle_time=6)
        took = time.monotonic() - began
    finally:
        rq_log.removeHandler(handler)
    assert stream.stopped, "the stop was delivered inside the log line"
    assert "Logging error" not in capsys.readouterr().err, "logging swallowed the stop"
    assert "idle for" not in stream.getvalue() and took < 3, f"the worker ran on for {took:.1f} s"


def test_a_swallowed_stop_ends_the_idle_wait_and_a_job_taken_meanwhile_goes_back_unclaimed(conn, worker):
    job_id, _ = enqueue(conn, "count", {"items": ["a"]})
    worker.bootstrap()
    try:
        stop_swallowed_then_taking_a_job(conn, worker, job_id)
    finally:
        worker.teardown()  # its pub/sub thread and its registration
    s = states.status(conn, job_id)
    assert (s["state"], s["attempts"]) == ("queued", 0)


def stop_swallowed_then_taking_a_job(conn, worker, job_id):
    with contextlib.suppress(StopRequested):  # code that catches everything
        worker.request_stop(signal.SIGTERM, None)

    with pytest.raises(StopRequested):  # before it would wait on the queue, or take a job
        worker.dequeue_job_and_maintain_ttl(timeout=1)
    assert conn.lrange(keys.rq_queue("leash"), 0, -1) == [job_id.encode()]

    # The stop came while the job was being taken (after the last check): it is not started.
    queue = LeashQueue("leash", connection=worker.connection, serializer=worker.serializer)
    job, _ = LeashQueue.dequeue_any([queue], None, connection=worker.connection, serializer=worker.serializer)
    with pytest.raises(StopRequested):
        worker.execute_job(job, queue)
    assert conn.lrange(keys.rq_queue("leash"), 0, -1) == [job_id.encode()], "back at the front of its queue"
    assert conn.llen(queue.intermediate_queue_key) == 0
