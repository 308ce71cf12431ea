"""Retention is one rule for every key a job owns, leash's and RQ's: however a job ends, each of
its keys expires within its retention (LEASH_RESULT_TTL) and each entry of it in RQ's registries
leaves within it too; RQ's record, which holds the submitted items, goes with the rest.

Each test ends a job one way and lists every key that names it, with its TTL.
"""

from __future__ import annotations

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import cancel, keys
from jobs.core import clock, states
from jobs.core.upkeep import consistency
from jobs.enqueue import enqueue
from jobs.worker.leash_worker import LeashWorker

from .conftest import wait_for

RETENTION = 600


@pytest.fixture
def retention(env):
    env.setenv("LEASH_RESULT_TTL", str(RETENTION))
    env.setenv("LEASH_RETRY_BACKOFF", "300")  # a retry waits in RQ's scheduled registry
    return RETENTION


def job_keys(conn, job_id: str) -> dict[str, int]:
    """Every key whose name holds the job's id, with its TTL (-1: none); the test kinds' own
    counters aside."""
    return {key.decode(): conn.ttl(key) for key in conn.scan_iter(match=f"*{job_id}*", count=1000)
            if not key.startswith(b"test:")}


def registry_entries(conn, job_id: str) -> dict[str, float]:
    """Each RQ sorted set (queues' registries) holding the job, with the job's score."""
    found = {}
    for key in conn.scan_iter(match="rq:*", count=1000):
        if conn.type(key) == b"zset":
            score = conn.zscore(key, job_id)
            if score is not None:
                found[key.decode()] = score
    return found


def assert_retained(conn, job_id: str, *, expect_rq_record: bool = True) -> dict[str, int]:
    """Every key of the job expires within its retention; RQ's registries let it go within it."""
    listed = job_keys(conn, job_id)
    assert keys.job(job_id) in listed
    if expect_rq_record:
        assert keys.rq_job(job_id) in listed
    kept = {key: ttl for key, ttl in listed.items() if not 0 < ttl <= RETENTION}
    assert not kept, f"keys kept past the retention: {kept} (all: {listed})"
    # RQ's finished and failed registries score an entry by when it expires (RQ's cleanup lets
    # it go then); its canceled registry by when the job was canceled, and the sweep lets those
    # go a retention later: none outlives the job.
    later = clock.wall() + RETENTION + 1
    by_expiry = (keys.rq_finished("leash", conn), keys.rq_failed("leash", conn))
    consistency.sweep(conn, now=later)
    left = registry_entries(conn, job_id)
    assert all(key in by_expiry and score <= later for key, score in left.items()), \
        f"a registry entry outlived the job's retention: {left}"
    return listed


def run_burst(conn) -> None:
    LeashWorker(["leash"], connection=conn).work(burst=True, with_scheduler=False)


def test_a_succeeded_job(conn, retention):
    job_id, _ = enqueue(conn, "count", {"items": ["a", "b"], "delay": 0}, owner="alice")
    run_burst(conn)
    assert states.status(conn, job_id)["state"] == "succeeded"
    assert_retained(conn, job_id)


def test_a_failed_job(conn, retention):
    job_id, _ = enqueue(conn, "permanent", {}, owner="alice")
    run_burst(conn)
    assert states.status(conn, job_id)["state"] == "failed"
    assert_retained(conn, job_id)


def test_a_job_canceled_while_queued(conn, retention):
    job_id, _ = enqueue(conn, "count", {"items": ["a"] * 100}, owner="alice")
    assert cancel(conn, job_id) == "queued"
    listed = assert_retained(conn, job_id)
    assert conn.hget(keys.rq_job(job_id), "status") == b"canceled" and listed[keys.rq_job(job_id)] > 0


def test_a_job_canceled_while_waiting_for_a_retry(conn, retention):
    job_id, _ = enqueue(conn, "boom", {}, owner="alice", max_attempts=2)
    run_burst(conn)
    assert conn.hget(keys.rq_job(job_id), "status") == b"scheduled"  # its retry waits in RQ
    assert states.status(conn, job_id)["attempts"] == 1
    assert cancel(conn, job_id) == "queued"
    listed = assert_retained(conn, job_id)
    assert keys.history(job_id) in listed and keys.errors(job_id) in listed


def test_a_job_canceled_while_running(conn, retention, workers):
    job_id, _ = enqueue(conn, "count", {"items": [f"i{n}" for n in range(40)], "delay": 0.2}, owner="alice")
    proc = workers.start("--burst", extra_env={"LEASH_RESULT_TTL": str(RETENTION)})
    wait_for(lambda: states.status(conn, job_id)["state"] == "running" and states.status(conn, job_id)["done"] >= 1,
             30, message="the job running")
    assert cancel(conn, job_id) == "running"
    wait_for(lambda: proc.poll() is not None, 30, message="the burst worker to finish")
    assert states.status(conn, job_id)["error"] == "canceled"
    assert_retained(conn, job_id)


def test_a_job_deleted_with_rqs_tools(conn, retention):
    job_id, _ = enqueue(conn, "count", {"items": ["a"]}, owner="alice")
    Job.fetch(job_id, connection=conn, serializer=JSONSerializer).delete()  # rq-dashboard's Delete
    consistency.sweep(conn)
    assert states.status(conn, job_id)["state"] == "failed"
    assert_retained(conn, job_id, expect_rq_record=False)


def test_a_job_canceled_with_rqs_tools(conn, retention):
    job_id, _ = enqueue(conn, "count", {"items": ["a"]}, owner="alice")
    Job.fetch(job_id, connection=conn, serializer=JSONSerializer).cancel()  # rq-dashboard's Cancel
    consistency.sweep(conn)
    assert states.status(conn, job_id)["state"] == "failed"
    assert_retained(conn, job_id)


def test_a_job_whose_rq_bookkeeping_a_full_redis_refused(conn, retention):
    """The work-horse ended the job in leash, then Redis refused RQ's own bookkeeping: RQ's
    record kept no expiry, and RQ's cleanup later put it back on the queue as if abandoned,
    where a worker finds it ended and drops it. Its record still goes with the job."""
    job_id, _ = enqueue(conn, "count", {"items": ["a"], "delay": 0}, owner="alice")
    run_burst(conn)
    assert states.status(conn, job_id)["state"] == "succeeded"
    # What the refused bookkeeping and RQ's cleanup left: status queued, no expiry, on the queue.
    conn.persist(keys.rq_job(job_id))
    conn.hset(keys.rq_job(job_id), "status", "queued")
    conn.zrem(keys.rq_finished("leash", conn), job_id)
    conn.rpush(keys.rq_queue("leash"), job_id)
    run_burst(conn)
    assert conn.llen(keys.rq_queue("leash")) == 0
    assert_retained(conn, job_id)


def test_a_job_an_earlier_release_canceled_leaves_with_its_registry_entry(conn, retention):
    """Before this rule a canceled job's RQ record kept no expiry, and outlived leash's record:
    the sweep lets both go once the cancel is older than the retention."""
    job_id, _ = enqueue(conn, "count", {"items": ["a"] * 100}, owner="alice")
    Job.fetch(job_id, connection=conn, serializer=JSONSerializer).cancel()
    conn.delete(keys.job(job_id))  # leash's record expired long ago
    assert conn.ttl(keys.rq_job(job_id)) == -1
    consistency.sweep(conn)
    assert conn.ttl(keys.rq_job(job_id)) == -1  # not yet a retention old
    consistency.sweep(conn, now=clock.wall() + RETENTION + 1)
    assert conn.zscore(keys.rq_canceled("leash", conn), job_id) is None
    assert 0 < conn.ttl(keys.rq_job(job_id)) <= 1 or not conn.exists(keys.rq_job(job_id))
