"""A batch job waiting at its provider is never lost by RQ's side: when its scheduled look (or
RQ's whole job) is deleted, the consistency sweep puts the look back and the job ends with every
item from its one provider batch; a look put back while the late one still reaches a worker is
harmless (claim_v4 hands one look at a time, each fenced by its token); finding the overdue looks
costs an idle sweep nothing; a late look says why it is late (real Redis, real workers)."""

from __future__ import annotations

import logging
import signal
import time
from datetime import UTC, datetime

import pytest
from rq.job import Job
from rq.registry import ScheduledJobRegistry
from rq.serializers import JSONSerializer
from rq.worker import Worker

from cli import status_text
from jobs import keys
from jobs.core import lease, states
from jobs.core.rq_side import rq_queue
from jobs.core.upkeep import consistency
from jobs.enqueue import enqueue
from tests.conftest import batch_settings, wait_for
from tests.test_batch_jobs import _hold, only_batch, submit_batch, waiting
from tests.test_idle_sweep import idle_sweep_commands
from tests.test_items_workers import ended, stored

LATE = 200.0  # seconds a look is overdue in these tests: past any grace (look_grace: at most 60 here)


def parked(conn, owner: str = "o") -> str:
    """A job parked as a batch job is, its look due LATE seconds ago, its RQ job scheduled for
    that look as the worker's ``Retry`` leaves it."""
    job_id, _ = enqueue(conn, "count", {"items": ["a", "b"]}, owner=owner)
    conn.hset(keys.job(job_id), "mode", "batch")  # what its status reads; no provider is asked here
    attempt = lease.claim(conn, job_id, "leash", "w")
    assert attempt.park(time.time() - LATE, (0, 0, 2, 1)) == 1
    conn.lrem(keys.rq_queue("leash"), 0, job_id)
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    rq_queue(conn, "leash").schedule_job(job, datetime.fromtimestamp(time.time() - LATE, UTC))
    return job_id


def make_late(conn, job_id: str) -> None:
    """The job's look was due LATE seconds ago (as if its scheduler had been away that long)."""
    look_at = time.time() - LATE
    overdue_at = look_at + lease.look_grace()
    conn.hset(keys.job(job_id), mapping={"look_at": look_at, "lease_expires_at": overdue_at})
    conn.zadd(keys.BATCH_LOOKS, {job_id: overdue_at})


def put_back_warnings(caplog, job_id: str) -> int:
    return sum(1 for r in caplog.records if r.levelno == logging.WARNING and job_id in r.getMessage()
               and "scheduled again" in r.getMessage())


def test_only_overdue_looks_are_read_and_a_lost_one_is_put_back_once(conn, caplog):
    idle = idle_sweep_commands(conn)
    conn.zadd(keys.BATCH_LOOKS, {f"on-time-{i}": time.time() + 3600 for i in range(5000)})
    assert idle_sweep_commands(conn) <= idle, "looks that are not overdue cost a sweep nothing"

    job_id = parked(conn)
    Job.fetch(job_id, connection=conn, serializer=JSONSerializer).delete()  # rq-dashboard's Delete
    with caplog.at_level(logging.WARNING, logger="leash.consistency"):
        first = consistency.sweep(conn)
        second = consistency.sweep(conn)

    assert (first["looks_put_back"], second["looks_put_back"]) == (1, 0)
    assert put_back_warnings(caplog, job_id) == 1
    assert conn.zscore(keys.rq_scheduled("leash", conn), job_id) is not None
    rebuilt = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    assert rebuilt.get_status().value == "scheduled" and rebuilt.args[0] == "count"


def test_a_late_look_still_in_rq_is_left_alone_and_an_ended_job_leaves_the_index(conn):
    late = parked(conn)
    over = parked(conn)
    conn.hset(keys.job(over), "state", "succeeded")
    counts = consistency.sweep(conn)
    assert counts["looks_put_back"] == 0
    assert conn.zscore(keys.BATCH_LOOKS, over) is None
    assert conn.zscore(keys.BATCH_LOOKS, late) > time.time() - 5  # read again after another grace only


def test_a_look_waiting_behind_the_owners_limit_is_not_stale_and_says_so(conn):
    job_id = parked(conn)
    # RQ's scheduler found every place of the owner taken: the look waits in the owner's limit.
    ScheduledJobRegistry("leash", connection=conn).remove(job_id)
    limit = keys.rq_rate_limit(keys.owner_rate_limit_key("o"), conn)
    conn.zadd(limit.rate_limited_key, {job_id: time.time()})
    conn.hset(keys.rq_job(job_id), "status", "rate_limited")

    status = states.status(conn, job_id)

    assert not status["stale"], "the look waits as the owner's limit says: nothing is stuck"
    assert "its look is waiting for a free place among the owner's 2 running jobs" in status["waiting"]
    assert consistency.sweep(conn)["looks_put_back"] == 0


def test_a_late_look_blames_missing_workers_only_when_no_worker_is_alive(conn):
    job_id = parked(conn)
    alone = states.status(conn, job_id)
    assert alone["stale"] and "no `leash worker` is running: start one" in alone["waiting"]

    worker = Worker(["leash"], connection=conn)
    worker.register_birth()
    try:
        busy = states.status(conn, job_id)
    finally:
        worker.register_death()
    assert busy["stale"] and "no `leash worker`" not in busy["waiting"]
    assert "is late: the workers are busy, or RQ lost the look" in busy["waiting"]
    line = next(x for x in status_text.lines(busy, "http://x") if x.startswith("state"))
    assert "is a worker running" not in line and "its look at the provider's batch is late" in line


# --- on real workers --------------------------------------------------------------------------


@pytest.fixture
def slow_looks(env, model_server):
    """Looks a minute apart: the test, not the poll, decides when a look is due."""
    server = batch_settings(env, model_server)
    env.setenv("LEASH_BATCH_POLL_SECONDS", "60")
    return server


@pytest.mark.slow
@pytest.mark.parametrize("lose", ["scheduled entry removed", "RQ's job hash deleted", "rq-dashboard delete"])
def test_a_waiting_job_whose_look_rq_lost_is_looked_at_again_and_succeeds(conn, workers, slow_looks, lose):
    server = slow_looks
    job_id, _ = submit_batch(conn, "r", 12)
    workers.start()
    waiting(conn, job_id)
    wait_for(lambda: conn.zscore(keys.rq_scheduled("leash", conn), job_id), 10,
             message="its next look, a minute away, scheduled in RQ")
    if lose == "scheduled entry removed":
        ScheduledJobRegistry("leash", connection=conn).remove(job_id)
    elif lose == "RQ's job hash deleted":
        conn.delete(keys.rq_job(job_id))
    else:
        Job.fetch(job_id, connection=conn, serializer=JSONSerializer).delete()
    server.batches.complete(only_batch(server))
    make_late(conn, job_id)

    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert final["done"] == 12 and stored(conn, job_id) == {i: f"echo: Say r{i}" for i in range(12)}
    assert server.batches.created == 1 and len(server.requests) == 0  # one batch, no direct call
    assert final["attempts"] == 1 and [h["ended"] for h in final["history"]] == ["succeeded"]
    assert final["usage"]["calls"] == 12


@pytest.mark.slow
def test_a_look_put_back_while_the_late_one_still_reaches_a_worker_stores_results_once(conn, workers, slow_looks):
    server = slow_looks
    job_id, _ = submit_batch(conn, "d", 10)
    first = workers.start()
    waiting(conn, job_id)
    first.send_signal(signal.SIGTERM)  # no worker, no scheduler: the look will be late
    assert first.wait(30) == 0
    server.batches.complete(only_batch(server))
    # The late look reaches its queue as RQ's scheduler moves it (through the owner's limit),
    # then RQ's job hash is deleted by hand: the queue still names the job, RQ cannot run it.
    assert conn.zscore(keys.rq_scheduled("leash", conn), job_id) is not None  # its next look, a minute away
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    ScheduledJobRegistry("leash", connection=conn).remove(job_id)
    rq_queue(conn, "leash").enqueue_job(job)
    assert conn.lpos(keys.rq_queue("leash"), job_id) is not None
    conn.delete(keys.rq_job(job_id))
    make_late(conn, job_id)

    assert consistency.sweep(conn)["looks_put_back"] == 1  # RQ's job rebuilt, the look scheduled now
    # Two looks now wait: the late one in the queue, the one put back in the scheduled registry.
    assert conn.lpos(keys.rq_queue("leash"), job_id) is not None
    assert conn.zscore(keys.rq_scheduled("leash", conn), job_id) is not None

    looking, release = _hold(server, "polled")  # the first look stops at the provider
    workers.start()
    workers.start()
    assert looking.wait(30)

    def second_look_dropped():
        return (conn.lpos(keys.rq_queue("leash"), job_id) is None
                and conn.zscore(keys.rq_scheduled("leash", conn), job_id) is None
                and conn.lpos(keys.rq_intermediate("leash", conn), job_id) is None)

    wait_for(second_look_dropped, 30, message="the second look taken by the other worker")
    assert states.status(conn, job_id)["batch"]["phase"] == "looking"  # the first look still holds the job
    release.set()
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert stored(conn, job_id) == {i: f"echo: Say d{i}" for i in range(10)}
    assert final["attempts"] == 1 and [h["ended"] for h in final["history"]] == ["succeeded"]
    assert final["usage"]["calls"] == 10, "one look stored the results and counted their calls"
    assert server.batches.created == 1 and len(server.requests) == 0
    assert int(conn.get(keys.REJECTED_WRITES) or 0) == 0  # no write of a second look was even tried
