"""A job RQ cannot read on a leash queue (pickled by RQ's default serializer, as `q.enqueue(f)`
and every `rq cron` job are; or naming a function nobody can import) never stops `leash worker`:
each is failed as RQ fails a job, with an error naming the cause and the fix, and the worker goes
on; RQ's maintenance survives such entries; a worker that does quit on an unhandled exception
exits non-zero."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from rq import Queue
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from cli import main
from jobs.core import states
from jobs.enqueue import enqueue
from jobs.worker.leash_worker import LeashWorker
from jobs.worker.unreadable import UNREADABLE
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


def failed_with(conn, job_id: str) -> str | None:
    """RQ's recorded error of a failed job, or None while it is not failed."""
    if job_id not in FailedJobRegistry("leash", connection=conn):
        return None
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    result = job.latest_result()
    return (result.exc_string if result is not None else None) or "failed, no text"


def test_a_leash_worker_keeps_serving_after_twenty_jobs_it_cannot_read(conn, workers):
    pickled = Queue("leash", connection=conn)  # RQ's default serializer: pickle
    plain = Queue("leash", connection=conn, serializer=JSONSerializer)
    unreadable = [pickled.enqueue("builtins.len", "abc").id for _ in range(10)]
    unknown = [plain.enqueue("no_such_module.nothing", n).id for n in range(10)]
    proc = workers.start("--no-scheduler")

    for job_id in unreadable:
        error = wait_for(lambda job_id=job_id: failed_with(conn, job_id), 60, message=f"pickled job {job_id} failed")
        assert error == UNREADABLE and "JSONSerializer" in error and "rq cron" in error
    for job_id in unknown:
        error = wait_for(lambda job_id=job_id: failed_with(conn, job_id), 60, message=f"unknown-function job {job_id}")
        assert "no_such_module" in error, error
    assert proc.poll() is None, "the worker quit"
    assert conn.llen(IntermediateQueue("rq:queue:leash", connection=conn).key) == 0

    job_id, _ = enqueue(conn, "classify", {"items": ["good film"], "labels": ["positive", "negative"]})
    wait_for(lambda: states.status(conn, job_id)["state"] == "succeeded", 60, message="a leash job after them")
    assert proc.poll() is None


def test_rq_maintenance_fails_an_unreadable_entry_left_in_the_intermediate_list(conn, env):
    job = Queue("leash", connection=conn).enqueue("builtins.len", "abc")
    queue = Queue("leash", connection=conn, serializer=JSONSerializer)
    conn.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")  # a dead worker's dequeue
    intermediate = IntermediateQueue(queue.key, connection=conn)
    worker = LeashWorker(["leash"], connection=conn)
    intermediate.cleanup(worker, queue)  # first seen
    conn.set(intermediate.get_first_seen_key(job.id), time.time() - 120)
    intermediate.cleanup(worker, queue)  # RQ's cleanup fails it: leash's handler must not raise
    assert failed_with(conn, job.id) == UNREADABLE
    assert conn.llen(queue.intermediate_queue_key) == 0


def test_a_worker_that_quits_on_an_unhandled_exception_exits_non_zero(conn, env, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("something RQ did not expect")

    with monkeypatch.context() as patched:
        patched.setattr(LeashWorker, "dequeue_job_and_maintain_ttl", broken)
        result = CliRunner().invoke(main, ["worker", "--burst", "--no-scheduler"])
    assert result.exit_code == 1, result.output
    again = CliRunner().invoke(main, ["worker", "--burst", "--no-scheduler"])
    assert again.exit_code == 0, (again.output, again.exception)
