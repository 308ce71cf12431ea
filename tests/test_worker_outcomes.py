"""How attempts end on leash workers (real processes where a kill, a cancel mid-run or the
scheduler is tested): retries, permanent errors, cancel, owner limits."""

from __future__ import annotations

import json
import os
import signal

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import cancel, keys
from jobs.core import states
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob
from jobs.worker.endings import CANCELED_IN_RQ_VIEW
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.slow


def final_state(conn, job_id, timeout=30):
    return wait_for(lambda: (s := states.status(conn, job_id))["state"] in ("succeeded", "failed") and s,
                    timeout, message=f"job {job_id} to end")


def test_a_job_that_always_raises_fails_after_exactly_max_attempts_with_its_steps(conn, workers, env, tmp_path):
    env.setenv("LEASH_RETRY_BACKOFF", "1")  # exercised through RQ's Retry and scheduler
    job_id, _ = enqueue(conn, "boom", {}, max_attempts=3)
    log = tmp_path / "worker.log"
    with log.open("w") as stream:
        workers.start(stderr=stream)
    final = final_state(conn, job_id, timeout=45)
    assert (final["state"], final["attempts"]) == ("failed", 3)
    assert final["error"].startswith("ValueError: boom on attempt 3")
    # The owner reads the message and the failing step, no server path; the log has the traceback.
    assert final["error"].splitlines()[-1].startswith("  tests.kinds_for_tests.boom, line ")
    assert "jobs.runner.execute" in final["error"]
    assert 'File "' not in final["error"] and str(ROOT) not in final["error"]
    # The work-horse logs the traceback after it has recorded the failure: wait for the line.
    text = wait_for(lambda: t if "boom on attempt 3" in (t := log.read_text()) else None, 20,
                    message="the worker to log attempt 3's traceback")
    assert "Traceback (most recent call last)" in text and str(ROOT) in text
    history = [json.loads(e) for e in conn.lrange(keys.errors(job_id), 0, -1)]
    assert [h["attempt"] for h in history] == [1, 2, 3]
    # leash records the failure in the work-horse before RQ's own handling writes RQ's status.
    wait_for(lambda: conn.hget(keys.rq_job(job_id), "status") == b"failed", 10, message="RQ's status failed")


def test_permanent_error_fails_after_one_attempt(conn, burst):
    job_id, _ = enqueue(conn, "permanent", {}, max_attempts=5)
    burst()
    final = final_state(conn, job_id)
    assert (final["state"], final["attempts"]) == ("failed", 1)
    assert "context length exceeded" in final["error"]


def test_cancel_stops_a_running_job_cooperatively_and_frees_the_worker(conn, workers):
    job_id, _ = enqueue(conn, "count", {"items": [f"i{n}" for n in range(50)], "delay": 0.2})
    workers.start("--no-scheduler")
    wait_for(lambda: states.status(conn, job_id)["done"] >= 2, 20)
    assert cancel(conn, job_id) == "running"
    final = final_state(conn, job_id, timeout=10)
    assert (final["state"], final["error"]) == ("failed", "canceled")
    assert final["done"] < 50
    # rq-dashboard shows RQ's record: a one-line note that Requeue is a replay, not a traceback.
    job = wait_for(lambda: (j := Job.fetch(job_id, connection=conn, serializer=JSONSerializer)).get_status()
                   == "failed" and j, 10, message="RQ's status failed")
    assert job.latest_result().exc_string == CANCELED_IN_RQ_VIEW
    follow_up, _ = enqueue(conn, "noop", {})
    assert final_state(conn, follow_up)["state"] == "succeeded", "the worker is free again"


def test_cancel_of_a_job_that_ignores_it_falls_back_to_rqs_stop_command(conn, workers, env):
    env.setenv("LEASH_CANCEL_GRACE", "0.5")
    env.setenv("LEASH_LEASE_SECONDS", "30")  # the lease stays alive: only the stop command ends it
    job_id, _ = enqueue(conn, "hang", {"seconds": 60})
    workers.start("--no-scheduler")
    # total becomes 1 at the job's one heartbeat: after it, nothing will see the cancel flag
    wait_for(lambda: states.status(conn, job_id)["total"] == 1, 10, message="the hung job's only heartbeat")
    cancel(conn, job_id)
    final = final_state(conn, job_id, timeout=15)
    assert (final["state"], final["error"]) == ("failed", "canceled")
    wait_for(lambda: conn.hget(keys.rq_job(job_id), "status") == b"stopped", 10, message="RQ's status stopped")


def test_cancel_of_a_queued_job_fails_it_at_once(conn):
    job_id, _ = enqueue(conn, "noop", {})
    assert cancel(conn, job_id) == "queued"
    fields = states.status(conn, job_id)
    assert (fields["state"], fields["error"], fields["attempts"]) == ("failed", "canceled", 0)
    assert conn.llen(keys.rq_queue("leash")) == 0


def test_owner_limit_holds_across_workers_and_a_killed_jobs_slot_is_freed(conn, workers, env):
    env.setenv("LEASH_OWNER_CONCURRENCY", "1")
    ids = [enqueue(conn, "count", {"items": ["a", "b", "c", "d", "e", "f"], "delay": 0.4}, owner="alice",
                   max_attempts=1)[0] for _ in range(3)]
    procs = [workers.start("--no-scheduler") for _ in range(3)]
    first = wait_for(lambda: next((i for i in ids if states.status(conn, i)["state"] == "running"), None), 10)
    # claimed first, forked a moment later: wait for the work-horse to exist
    owner = wait_for(lambda: next((p for p in procs if workers.children(p)), None), 10, message="the busy worker")
    horse = workers.horse(owner)
    os.kill(owner.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    max_running = 0

    def all_ended():
        nonlocal max_running
        fields = [states.status(conn, i) for i in ids]
        max_running = max(max_running, sum(f["state"] == "running" for f in fields))
        return all(f["state"] in ("succeeded", "failed") for f in fields) and fields

    fields = wait_for(all_ended, 40, interval=0.05, message="all of alice's jobs to end")
    assert max_running == 1, "never two of one owner's jobs running at once"
    by_id = dict(zip(ids, fields, strict=True))
    assert by_id[first]["state"] == "failed" and by_id[first]["error"].startswith("lease expired")
    assert [by_id[i]["state"] for i in ids if i != first] == ["succeeded", "succeeded"], \
        "the killed job's slot was freed by reclaim"


def test_idempotency_key_returns_the_first_job_and_creates_nothing(conn):
    first, created = enqueue(conn, "noop", {}, owner="bob", idempotency_key="order-17")
    again, created_again = enqueue(conn, "noop", {}, owner="bob", idempotency_key="order-17")
    other_owner, _ = enqueue(conn, "noop", {}, owner="carol", idempotency_key="order-17")
    assert (again, created, created_again) == (first, True, False)
    assert other_owner != first
    assert conn.llen(keys.rq_queue("leash")) == 2
    assert len(conn.keys("leash:job:*")) == 2


@pytest.mark.parametrize("kind, payload, message", [
    ("nope", {"items": ["a"]}, "unknown kind"),
    ("classify", {"items": [], "labels": ["x"]}, "empty"),
    ("classify", {"items": "abc", "labels": ["x"]}, "list of strings"),
    ("classify", {"items": [1], "labels": ["x"]}, "must be a string"),
    ("classify", {"items": ["a"]}, "'labels'"),
    ("classify", {"items": ["a"], "labels": ["x"], "bad": {1, 2}}, "JSON"),
    ("classify", ["not", "an", "object"], "JSON object"),
])
def test_bad_input_raises_a_clear_error_before_anything_is_written(conn, kind, payload, message):
    with pytest.raises(InvalidJob, match=message):
        enqueue(conn, kind, payload)
    assert conn.dbsize() == 0


def test_rqs_abandoned_job_sweep_never_fights_the_lease(conn, workers):
    from rq.registry import StartedJobRegistry

    job_id, _ = enqueue(conn, "count", {"items": [f"i{n}" for n in range(15)], "delay": 0.2,
                                        "item_concurrency": 2})
    first = workers.start("--no-scheduler")
    wait_for(lambda: states.status(conn, job_id)["done"] >= 3, 20)
    registry = StartedJobRegistry("leash", connection=conn)
    member, score = conn.zrange(registry.key, 0, -1, withscores=True)[0]
    lease_expires = float(conn.hget(keys.job(job_id), "lease_expires_at"))
    assert member.decode().startswith(job_id + ":")
    assert score >= lease_expires + 59, "RQ's liveness score follows the lease"
    registry.cleanup()  # RQ's sweep while the lease is alive: nothing to do
    assert states.status(conn, job_id)["state"] == "running"
    assert conn.hget(keys.rq_job(job_id), "status") == b"started"

    horse = workers.horse(first)
    os.kill(first.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    workers.start("--no-scheduler")
    wait_for(lambda: states.status(conn, job_id)["attempts"] == 2, 10, message="leash's reclaim")
    assert not any(m.decode().endswith(member.decode().split(":", 1)[1]) for m in conn.zrange(registry.key, 0, -1)), \
        "the dead attempt's RQ entry went with the reclaim"
    registry.cleanup(timestamp=score + 1)  # RQ's sweep after the dead entry would have expired
    final = final_state(conn, job_id)
    assert (final["state"], final["attempts"]) == ("succeeded", 2)
    # RQ's own bookkeeping follows leash's fenced write, within moments.
    wait_for(lambda: conn.hget(keys.rq_job(job_id), "status") == b"finished", 5, message="RQ's finished status")


def test_a_horse_dying_between_its_recorded_failure_and_rqs_bookkeeping_is_retried_at_once(conn, workers):
    job_id, _ = enqueue(conn, "dies_after_recording_failure", {}, max_attempts=2)
    workers.start("--no-scheduler")
    final = final_state(conn, job_id, timeout=15)  # RQ's own sweep would take 60 s or more
    assert (final["state"], final["attempts"]) == ("succeeded", 2)
    assert final["result"]["summary"] == {"attempt": 2}


def test_a_redis_blip_under_a_job_hands_it_back_without_spending_an_attempt(conn, burst):
    job_id, _ = enqueue(conn, "redis_blip", {}, max_attempts=1)
    burst()
    final = final_state(conn, job_id)
    assert (final["state"], final["attempts"]) == ("succeeded", 1)
    assert conn.hget(keys.job(job_id), "handoffs") == b"1"


def test_a_worker_on_several_queues_takes_them_in_order_and_never_holds_a_job_outside_a_list(conn, env, workers):
    from rq.intermediate_queue import IntermediateQueue

    env.setenv("LEASH_QUEUE", "high,low")

    low, _ = enqueue(conn, "noop", {}, queue="low")
    high, _ = enqueue(conn, "noop", {}, queue="high")
    swallowed, _ = enqueue(conn, "noop", {}, queue="low", owner="bob")  # bob's own slot: on the queue at once
    # As if a worker killed in its dequeue had taken the last one: it sits in low's intermediate list.
    assert conn.lrem(keys.rq_queue("low"), 0, swallowed) == 1
    conn.rpush(IntermediateQueue.get_intermediate_queue_key(keys.rq_queue("low")), swallowed)
    workers.start("--no-scheduler", "--queue", "high,low")
    finals = {job_id: final_state(conn, job_id, timeout=20) for job_id in (high, low, swallowed)}
    assert {f["state"] for f in finals.values()} == {"succeeded"}
    started = {job_id: float(conn.hget(keys.job(job_id), "started_at")) for job_id in (high, low)}
    assert started[high] < started[low], "the first queue named is served first"
    assert finals[swallowed]["attempts"] == 1, "the swallowed job went back without losing an attempt"
    for name in ("high", "low"):
        assert conn.llen(IntermediateQueue.get_intermediate_queue_key(keys.rq_queue(name))) == 0
