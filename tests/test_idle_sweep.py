"""The consistency sweep's cost follows what changed, not how many jobs wait: a tick where
nothing moved reads no job, and a job RQ's tools delete among thousands of queued ones is
recorded failed by the next tick (real Redis; one test with a real idle worker)."""

from __future__ import annotations

import time

import pytest
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.core.upkeep import consistency, rq_changes
from jobs.enqueue import enqueue
from tests.conftest import wait_for

OWNERS = 50


def fill(conn, n: int, start: int = 0, queue: str | None = None) -> list[str]:
    return [enqueue(conn, "noop", {}, owner=f"owner-{i % OWNERS}", queue=queue)[0] for i in range(start, start + n)]


def calls(conn) -> int:
    return sum(v["calls"] for v in conn.info("commandstats").values())


def idle_sweep_commands(conn, rounds: int = 5) -> float:
    """Commands one sweep costs, on average over a few, once the last one has seen everything
    (the INFO call's own is taken off)."""
    consistency.sweep(conn)
    before = calls(conn)
    for _ in range(rounds):
        consistency.sweep(conn)
    return (calls(conn) - before - 1) / rounds


def failed(conn, job_id: str) -> bool:
    return conn.hget(keys.job(job_id), "state") == b"failed" and conn.zscore(keys.FAILED_INDEX, job_id) is not None


@pytest.mark.slow
def test_an_idle_sweep_costs_the_same_with_5000_queued_as_with_500(conn):
    fill(conn, 500)
    small = idle_sweep_commands(conn)
    fill(conn, 4500, start=500)
    large = idle_sweep_commands(conn)

    # The rotation's slice and a few sizes per queue and owner: nothing that grows with the queue.
    assert large <= small * 1.2 + 10, (small, large)
    assert large < 3 * consistency.ROTATION_MIN + 10 * OWNERS, large


def test_a_tick_where_nothing_moved_reads_no_job_of_rq(conn):
    fill(conn, 300)
    consistency.sweep(conn)
    changes = rq_changes.observe(conn)
    assert changes.holders == [] and changes.suspects == {}, "nothing moved since the last sweep"


@pytest.mark.slow
def test_jobs_deleted_among_5000_queued_are_failed_by_the_next_sweep(conn):
    ids = fill(conn, 5000)
    consistency.sweep(conn)
    consistency.sweep(conn)
    waiting = ids[-1]  # far past any rotation slice, waiting for its owner's slot
    holding = ids[0]  # in RQ's queue, holding a slot
    assert conn.zscore(keys.rq_rate_limit(keys.owner_rate_limit_key("owner-49"), conn).rate_limited_key,
                       waiting) is not None
    Job.fetch(waiting, connection=conn, serializer=JSONSerializer).delete()
    Job.fetch(holding, connection=conn, serializer=JSONSerializer).delete()

    counts = consistency.sweep(conn)

    assert counts["removed"] == 2
    assert failed(conn, waiting) and failed(conn, holding)
    assert conn.hget(keys.job(waiting), "error").decode() == consistency.REMOVED


@pytest.mark.slow
def test_rq_empty_among_5000_queued_fails_every_emptied_job_in_one_sweep(conn):
    ids = fill(conn, 5000)
    consistency.sweep(conn)
    in_queue = [j.decode() for j in conn.lrange(keys.rq_queue("leash"), 0, -1)]
    assert len(in_queue) == 2 * OWNERS  # the owners' slots; the rest wait for them

    Queue("leash", connection=conn).empty()  # what `rq empty leash` runs
    counts = consistency.sweep(conn)

    assert counts["removed"] == len(in_queue)
    assert all(failed(conn, j) for j in in_queue)
    # The emptied jobs' slots went to the next waiting jobs, which are fine.
    assert conn.llen(keys.rq_queue("leash")) == 2 * OWNERS
    assert sum(1 for j in ids if conn.hget(keys.job(j), "state") == b"queued") == 5000 - len(in_queue)


def test_the_rotation_skips_no_job_when_jobs_before_its_position_leave(conn):
    ids = fill(conn, 30)
    for job_id in ids[:10]:  # ended: the rotation takes them out of ACTIVE as it passes
        consistency.end_outside(conn, job_id, "ended elsewhere")
    for job_id in ids[10:]:  # RQ's record gone without a trace in any size (deleted by hand)
        conn.delete(keys.rq_job(job_id))
    conn.delete(keys.SWEEP_QUEUES_SEEN, keys.SWEEP_OWNERS_SEEN)
    rq_changes.record(conn, rq_changes.observe(conn), unsettled_owners=set())  # sizes as they are now

    removed = sum(consistency.sweep(conn, batch=10)["removed"] for _ in range(3))

    assert removed == 20, "a rank cursor would skip the ten jobs that shifted below it"


def test_every_key_of_an_ended_job_left_without_an_expiry_gets_the_records(conn):
    job_id = fill(conn, 1)[0]
    consistency.end_outside(conn, job_id, "ended elsewhere")
    lasting = keys.ended_job_keys(job_id)
    for key in lasting:  # what a script that did not know these keys leaves behind
        conn.delete(key)
        conn.rpush(key, "x") if key in (keys.errors(job_id), keys.history(job_id)) else conn.hset(key, "f", "x")
    conn.persist(keys.job(job_id))
    conn.expire(keys.job(job_id), 1000)

    consistency.sweep(conn)

    assert conn.zscore(keys.ACTIVE, job_id) is None
    assert all(0 < conn.ttl(key) <= 1000 for key in lasting), {key: conn.ttl(key) for key in lasting}


@pytest.mark.slow
def test_a_job_deleted_while_3000_wait_is_failed_within_seconds_by_an_idle_worker(conn, workers, env):
    env.setenv("LEASH_QUEUE", "leash,parked")
    ids = fill(conn, 3000, queue="parked")  # a queue the worker does not serve: it stays idle
    workers.start("--queue", "leash", "--no-scheduler")
    wait_for(lambda: conn.hlen(keys.SWEEP_OWNERS_SEEN) == OWNERS, 20, message="the worker's first sweeps")
    victim = ids[len(ids) // 2]

    deleted_at = time.monotonic()
    Job.fetch(victim, connection=conn, serializer=JSONSerializer).delete()
    wait_for(lambda: failed(conn, victim), 10, message="the deleted job recorded failed")
    assert time.monotonic() - deleted_at < 10
