"""Worker death, for real: SIGKILL, orphaned work-horses, SIGSTOP zombies, SIGTERM deploys."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil
import pytest
from rq.serializers import JSONSerializer
from rq.worker import Worker

from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.kinds_for_tests import item_calls

pytestmark = pytest.mark.slow

ITEMS = [f"item-{i}" for i in range(20)]


def state(conn, job_id):
    return states.status(conn, job_id)


def test_sigkill_of_whole_worker_mid_job_is_resumed_elsewhere_within_lease_plus_3s(conn, workers):
    # Two items at a time: the job outlasts the moment of the kill.
    job_id, _ = enqueue(conn, "count", {"items": ITEMS, "delay": 0.2, "item_concurrency": 2})
    first = workers.start("--no-scheduler")
    wait_for(lambda: state(conn, job_id)["done"] >= 5, 20, message="progress on the first worker")
    horse = workers.horse(first)
    second = workers.start("--no-scheduler")
    done_before_kill = set(int(k) for k in conn.hkeys(keys.items(job_id)))
    os.kill(first.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    killed_at = time.monotonic()

    wait_for(lambda: state(conn, job_id)["attempts"] == 2 and state(conn, job_id)["state"] == "running",
             2 + 3, message="the job running again on the second worker")
    resumed_after = time.monotonic() - killed_at
    final = wait_for(lambda: (s := state(conn, job_id))["state"] == "succeeded" and s, 30)

    assert resumed_after <= 5.0
    assert final["done"] == final["total"] == 20
    calls = item_calls(conn, job_id)
    assert all(calls[i] == 1 for i in done_before_kill), "checkpointed items were computed again"
    assert sorted(calls) == list(range(20))
    assert second.poll() is None


def test_orphaned_work_horse_is_reclaimed_and_its_late_result_rejected(conn, workers):
    # One item at a time: the orphan is still working when its lease runs out.
    job_id, _ = enqueue(conn, "count", {"items": ITEMS, "delay": 0.3, "record_pid": True, "item_concurrency": 1})
    first = workers.start("--no-scheduler")
    wait_for(lambda: state(conn, job_id)["done"] >= 2, 20)
    orphan = workers.horse(first)
    os.kill(first.pid, signal.SIGKILL)  # only the main process: the horse keeps running
    workers.start("--no-scheduler")

    wait_for(lambda: state(conn, job_id)["attempts"] == 2, 10, message="reclaim of the orphan's job")
    final = wait_for(lambda: (s := state(conn, job_id))["state"] == "succeeded" and s, 40)
    assert final["attempts"] == 2
    # The orphan stops at its first write after the reclaim; it must not have finished the job.
    wait_for(lambda: not _alive(orphan), 20, message="the orphan to exit")
    finishers = [int(p) for p in conn.lrange(f"test:finished_by:{job_id}", 0, -1)]
    assert orphan not in finishers
    assert len(finishers) == 1
    assert int(conn.get(keys.REJECTED_WRITES) or 0) >= 1
    assert state(conn, job_id)["state"] == "succeeded"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_sigstopped_zombie_is_superseded_and_its_writes_rejected_after_sigcont(conn, workers):
    job_id, _ = enqueue(conn, "count", {"items": ITEMS[:10], "delay": 0.3, "effect": True, "record_pid": True,
                                        "item_concurrency": 2})
    # A 4-s lease rather than the tests' 2 s: a work-horse starved of CPU on a busy machine
    # must not lose the job before the test stops it, or the attempts below are not these.
    longer_lease = {"LEASH_LEASE_SECONDS": "4"}
    first = workers.start("--no-scheduler", extra_env=longer_lease)
    wait_for(lambda: state(conn, job_id)["done"] >= 2, 20)
    zombie_horse = workers.horse(first)
    for pid in (first.pid, zombie_horse):
        os.kill(pid, signal.SIGSTOP)
    try:
        workers.start("--no-scheduler", extra_env=longer_lease)
        final = wait_for(lambda: (s := state(conn, job_id))["state"] == "succeeded" and s, 30,
                         message="the live attempt finishing while the zombie is stopped")
    finally:
        for pid in (first.pid, zombie_horse):
            with contextlib.suppress(ProcessLookupError):  # the assertions below say what went wrong
                os.kill(pid, signal.SIGCONT)
    rejected_before = int(conn.get(keys.REJECTED_WRITES) or 0)
    wait_for(lambda: int(conn.get(keys.REJECTED_WRITES) or 0) > rejected_before or not _alive(zombie_horse), 15,
             message="the zombie's next write to be refused (or the zombie stopped by its worker)")
    wait_for(lambda: not _alive(zombie_horse), 15, message="the zombie work-horse to stop")
    after = state(conn, job_id)
    assert after["state"] == "succeeded" and after["attempts"] == final["attempts"] == 2
    assert after["result"] == final["result"]
    assert int(conn.get(f"test:effect:{job_id}")) == 1, "the side effect ran exactly once"
    assert [int(p) for p in conn.lrange(f"test:finished_by:{job_id}", 0, -1)] != [zombie_horse]
    assert first.poll() is None, "the woken worker carries on serving"


def test_sigterm_hands_the_job_to_another_worker_without_counting_an_attempt(conn, workers):
    job_id, _ = enqueue(conn, "count", {"items": ITEMS, "delay": 1.0, "item_concurrency": 2})  # ~10 s
    first = workers.start("--no-scheduler")
    wait_for(lambda: state(conn, job_id)["done"] >= 4, 20)
    workers.start("--no-scheduler")
    # The second worker up and listening first: on a loaded machine its start-up alone can take
    # seconds, which says nothing about the hand-off.
    wait_for(lambda: len(Worker.all(connection=conn, serializer=JSONSerializer)) == 2, 60,
             message="the second worker to register")
    assert state(conn, job_id)["state"] == "running", "the job ended before the hand-off could be tried"
    first.send_signal(signal.SIGTERM)  # like honcho or a deploy: only the main process
    sent = time.monotonic()
    # handoffs == 1 is what tells a hand-off from a reclaim after the lease ran out (which would
    # count an attempt); the time it took is printed, not asserted (docs/BENCHMARKS.md has it).
    wait_for(lambda: conn.hget(keys.job(job_id), "handoffs") == b"1" and state(conn, job_id)["state"] == "running",
             30, interval=0.02, message="another worker resuming the job")
    resumed_after = time.monotonic() - sent
    print(f"\nSIGTERM to another worker running the job: {resumed_after:.2f} s")
    assert first.wait(timeout=25) == 0, "the worker exits cleanly well inside Heroku's 30 s"
    final = wait_for(lambda: (s := state(conn, job_id))["state"] == "succeeded" and s, 30)
    assert final["attempts"] == 1, "a deploy is not a failure"
    assert item_calls(conn, job_id) == {i: 1 for i in range(20)}, "nothing was redone"


def test_hung_job_is_reclaimed_and_its_work_horse_stopped(conn, workers):
    job_id, _ = enqueue(conn, "hang", {"seconds": 60}, max_attempts=1)
    first = workers.start("--no-scheduler")
    wait_for(lambda: state(conn, job_id)["state"] == "running", 10)
    horse = workers.horse(first)
    final = wait_for(lambda: (s := state(conn, job_id))["state"] == "failed" and s, 10,
                     message="the hung job to be reclaimed and failed at max attempts")
    assert final["error"].startswith("lease expired")
    wait_for(lambda: not _alive(horse), 10, message="the hung work-horse to be killed by its worker")
    assert first.poll() is None


def test_a_job_that_does_not_hand_off_in_the_grace_period_is_stopped_and_released(conn, workers, env):
    env.setenv("LEASH_HANDOFF_GRACE", "1")
    env.setenv("LEASH_LEASE_SECONDS", "30")  # only the hand-off, not a lease expiry, may free it
    job_id, _ = enqueue(conn, "hang", {"seconds": 60}, max_attempts=1)
    first = workers.start("--no-scheduler")
    wait_for(lambda: state(conn, job_id)["state"] == "running", 10)
    workers.horse(first)  # the work-horse is running: the shutdown must hand it off
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=15) == 0
    fields = wait_for(lambda: (s := state(conn, job_id))["state"] == "queued" and s, 5)
    assert fields["attempts"] == 0, "a deploy is not a failure"
    assert conn.lindex(keys.rq_queue("leash"), 0) == job_id.encode()


def test_a_second_sigterm_releases_the_job_at_once(conn, workers, env):
    env.setenv("LEASH_LEASE_SECONDS", "30")
    job_id, _ = enqueue(conn, "hang", {"seconds": 60}, max_attempts=1)
    first = workers.start("--no-scheduler")
    wait_for(lambda: state(conn, job_id)["state"] == "running", 10)
    workers.horse(first)  # the work-horse is running: the shutdown must hand it off
    first.send_signal(signal.SIGTERM)
    time.sleep(1.2)  # RQ ignores a second signal within 1 s of the first (a pool's duplicate)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=10) is not None
    fields = wait_for(lambda: (s := state(conn, job_id))["state"] == "queued" and s, 5)
    assert fields["attempts"] == 0


def test_retries_keep_flowing_when_the_worker_holding_the_scheduler_lock_is_killed(conn, workers, env):
    env.setenv("LEASH_RETRY_BACKOFF", "1")
    lock = keys.rq_scheduler_lock("leash")
    first = workers.start()  # with RQ's scheduler, which takes the queue's lock
    wait_for(lambda: conn.get(lock), 15, message="the first worker's scheduler to hold the lock")
    workers.start()
    scheduler = wait_for(lambda: workers.children(first), 10, message="the first worker's scheduler process")
    for pid in [first.pid, *scheduler]:
        os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    job_id, _ = enqueue(conn, "boom", {}, max_attempts=2)
    final = wait_for(lambda: (s := state(conn, job_id))["state"] == "failed" and s, 40,
                     message="the retry to be scheduled by the surviving worker")
    # RQ alone would leave the dead scheduler's lock for 61 s, and a job its dead dequeue
    # swallowed in its intermediate list for a minute or more; leash frees both in seconds.
    assert time.monotonic() - killed_at < 30
    assert final["attempts"] == 2


def test_a_worker_killed_in_its_dequeue_lets_go_of_redis_though_its_scheduler_lives_on(conn, workers, env):
    """A fork shares sockets, and Redis sees a connection end only when its last holder closes
    it: the retry scheduler closes its copies of the worker's, so a worker SIGKILLed while
    blocked in its dequeue (OOM) leaves no dequeue behind for Redis to hand the next job to."""
    env.setenv("LEASH_LEASE_SECONDS", "20")  # a 5-s dequeue: long enough to see it outlive the kill
    worker = workers.start()  # with RQ's scheduler, forked from it

    def blocked_dequeue():
        return next((c["addr"] for c in conn.client_list() if c.get("cmd") in ("blmove", "brpoplpush")), None)

    dequeue = wait_for(blocked_dequeue, 15, message="the worker blocked in its dequeue")
    [scheduler] = wait_for(lambda: workers.children(worker), 10, message="the worker's scheduler process")

    def holds_the_dequeue_socket() -> bool:
        return any(f"{c.laddr.ip}:{c.laddr.port}" == dequeue for c in psutil.Process(scheduler).net_connections("tcp"))

    wait_for(lambda: not holds_the_dequeue_socket(), 10, message="the scheduler to close its copy of the socket")
    os.kill(scheduler, signal.SIGSTOP)  # it cannot notice the death, nor exit, while the test looks
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(lambda: dequeue not in {c["addr"] for c in conn.client_list()}, 2,
             message="Redis to drop the dead worker's dequeue")
    job_id, _ = enqueue(conn, "noop", {})
    assert conn.lrange(keys.rq_queue("leash"), 0, -1) == [job_id.encode()]
    assert conn.llen(keys.rq_intermediate("leash", conn)) == 0
