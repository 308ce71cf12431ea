"""A full Redis that lasts longer than the lease never pays twice.

While Redis refuses writes, a running job's answers wait in its work-horse and its lease
cannot be renewed. When memory returns, the reaper must not take the job back before that
work-horse has written what it holds: another worker would start a new attempt and ask the
provider again for the answers already paid for. Here a job runs eight items at once on a
real Redis with a small ``maxmemory``; Redis stays full for three lease lengths; its
work-horse is slow to come back (stopped, as one sitting out its longest backoff would be),
and a second worker that never saw Redis full (stopped meanwhile, so no backoff holds it
back) is ready to take the job the moment memory is freed: no item is asked twice."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from rq.serializers import JSONSerializer
from rq.worker import Worker

from cli.devserver import start_redis, stop
from jobs import keys
from jobs.core import lease, states
from jobs.core.store import memory_wait
from jobs.core.upkeep.reaper import Reaper
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.test_items_workers import calls_per_item

LEASE = 4.0
#: How long the work-horse stays away after memory is freed: more than the lease, less than
#: the grace (a lease plus the longest backoff, 5 s: 9 s), with room left in the grace for a
#: loaded machine's work-horse to write what it holds and renew its lease.
HORSE_AWAY = 5.0


@pytest.fixture
def refusals(monkeypatch):
    """This process's record of refused writes, fresh (it is process-wide)."""
    for name in ("last_refused_at", "refused_since", "writes_back_at"):
        monkeypatch.setattr(memory_wait, name, None)
    return memory_wait


def claimed(conn, now: float):
    job_id, _ = enqueue(conn, "classify", {"items": ["a"], "labels": ["x", "y"]}, now=now - 1)
    return job_id, lease.claim(conn, job_id, "leash", "w1", now=now)


def test_the_reaper_grants_a_lease_that_ran_out_while_redis_refused_writes_a_grace(conn, refusals):
    job_id, attempt = claimed(conn, now=1000.0)
    early_id, _ = claimed(conn, now=990.0)  # ran out before Redis refused anything: a dead worker's
    expiry = 1000.0 + attempt.lease_seconds
    refusals.note_refused(now=expiry - 0.5)
    refusals.note_refused(now=expiry + 5)  # still full after the lease ran out
    refusals.note_writes_back(now=expiry + 6)
    reaper = Reaper(conn, "test-reaper", interval=1)
    assert reaper.reap(now=expiry + 6.5) == 1, "only the lease that ran out before the refusals"
    assert states.status(conn, early_id)["state"] == "queued"
    grace_end = expiry + 6 + attempt.lease_seconds + memory_wait.MAX_DELAY
    assert reaper.reap(now=grace_end - 0.1) == 0
    assert states.status(conn, job_id)["state"] == "running"
    # Renewed in time, the attempt goes on; not renewed, it is taken back once the grace is over.
    assert reaper.reap(now=grace_end + 0.1) == 1
    assert states.status(conn, job_id)["attempts"] == 1 and states.status(conn, job_id)["state"] == "queued"


@pytest.mark.slow
def test_a_full_redis_longer_than_the_lease_asks_no_call_twice(tmp_path, env, workers, model_server):
    server = model_server
    server.latency = 0.4
    (tmp_path / "redis").mkdir()
    proc, url = start_redis(tmp_path / "redis")
    try:
        full = redis.Redis.from_url(url)
        full.config_set("maxmemory-policy", "noeviction")
        env.setenv("REDIS_URL", url)
        env.setenv("LEASH_LEASE_SECONDS", f"{LEASE:g}")
        env.setenv("LEASH_ITEM_CONCURRENCY", "8")
        items = [f"item {n}" for n in range(400)]  # ~20 s of calls: still running when Redis fills
        job_id, _ = enqueue(full, "prompt", {"items": items, "template": "{item}"}, max_attempts=5)
        first = workers.start("--no-scheduler", extra_env={"REDIS_URL": url})
        wait_for(lambda: states.status(full, job_id)["done"] >= 8, 60, message="eight items stored")
        horse = workers.horse(first)
        second = workers.start("--no-scheduler", extra_env={"REDIS_URL": url})
        wait_for(lambda: len(Worker.all(connection=full, serializer=JSONSerializer)) == 2, 60,
                 message="the second worker to register")
        os.kill(second.pid, signal.SIGSTOP)  # idle, away while Redis is full: it meets no refusal

        full.config_set("maxmemory", int(full.info("memory")["used_memory"]) // 2)
        # The calls in flight when Redis filled up are answered (paid for) while it stays full.
        held_until = time.monotonic() + 3 * LEASE
        try:
            while time.monotonic() < held_until:
                assert first.poll() is None, "the worker exited while Redis was full"
                time.sleep(0.2)
            assert full.hget(keys.job(job_id), "state") == b"running"
            assert full.zscore(keys.LEASES, job_id) < time.time(), "the lease ran out while Redis was full"
            held = len(calls_per_item(server)) - int(full.hget(keys.job(job_id), "done"))
            assert held > 0, "no answer was waiting in the work-horse"
            os.kill(horse, signal.SIGSTOP)
        finally:
            full.config_set("maxmemory", 0)  # memory freed
            os.kill(second.pid, signal.SIGCONT)
        try:
            away_until = time.monotonic() + HORSE_AWAY
            while time.monotonic() < away_until:
                assert second.poll() is None and first.poll() is None
                time.sleep(0.2)
        finally:
            try:
                os.kill(horse, signal.SIGCONT)
            except ProcessLookupError:
                pass  # its worker stopped it: the job was taken from it

        final = wait_for(lambda: (s := states.status(full, job_id))["state"] in ("succeeded", "failed") and s,
                         120, message="the job to end after memory was freed")
        assert final["state"] == "succeeded", final["error"]
        assert final["done"] == len(items)
        counts = calls_per_item(server)
        assert set(counts) == set(items)
        assert {item: n for item, n in counts.items() if n > 1} == {}, f"calls asked twice ({held} were held)"
        assert final["attempts"] == 1, "the job was reclaimed from the worker that held its answers"
        full.close()
    finally:
        stop([proc], grace=5)
