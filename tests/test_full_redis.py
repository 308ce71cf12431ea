"""A full Redis (maxmemory with noeviction) never kills a worker: each waits for memory, and
the jobs that were running when Redis filled up end true once memory is freed."""

from __future__ import annotations

import time

import pytest
import redis

from cli.devserver import start_redis, stop
from jobs import keys
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.web_support import CLASSIFY, create_app_with

pytestmark = pytest.mark.slow


def test_workers_stay_up_through_a_full_redis_and_their_running_jobs_end_true(tmp_path, env, workers):
    (tmp_path / "redis").mkdir()
    proc, url = start_redis(tmp_path / "redis")
    try:
        full = redis.Redis.from_url(url)
        full.config_set("maxmemory-policy", "noeviction")
        env.setenv("REDIS_URL", url)
        items = [f"item {n}" for n in range(30)]
        ids = [enqueue(full, "sleepy", {"items": items, "delay": 0.25}, owner=f"o{n}")[0] for n in range(2)]
        logs = [(tmp_path / f"worker-{n}.log").open("wb") for n in range(2)]
        procs = [workers.start("--log-level", "INFO", extra_env={"REDIS_URL": url}, stderr=logs[n]) for n in range(2)]
        wait_for(lambda: all(full.hget(keys.job(i), "state") == b"running" for i in ids), 30,
                 message="both jobs running")

        # Full: a limit far under what is used (whatever client buffers come and go), so every
        # write that could add memory is refused.
        full.config_set("maxmemory", int(full.info("memory")["used_memory"]) // 2)
        refused = create_app_with(REDIS_URL=url).test_client().post("/jobs", json=CLASSIFY)
        assert refused.status_code == 503

        # Three lease lengths full: no worker exits (the condition is "still alive at the end").
        held_until = time.monotonic() + 6
        while time.monotonic() < held_until:
            assert all(p.poll() is None for p in procs), "a worker exited while Redis was full"
            time.sleep(0.2)
        assert [full.hget(keys.job(i), "state") for i in ids] == [b"running"] * 2, [full.hgetall(keys.job(i)) for i in ids]

        full.config_set("maxmemory", 0)  # memory freed (a bigger plan)
        wait_for(lambda: all(full.hget(keys.job(i), "state") == b"succeeded" for i in ids), 60,
                 message="both jobs succeeded after memory was freed")
        assert all(p.poll() is None for p in procs), "the same worker processes are still up"
        for i in ids:
            assert len(full.hgetall(keys.items(i))) == len(items)
        # RQ's bookkeeping refused meanwhile or not, its record goes with the job (retention).
        wait_for(lambda: all(0 < full.ttl(keys.rq_job(i)) <= full.ttl(keys.job(i)) + 1 for i in ids), 30,
                 message="RQ's records of the ended jobs expiring with them")
        assert create_app_with(REDIS_URL=url).test_client().post("/jobs", json=CLASSIFY).status_code == 202

        for log in logs:
            log.close()
        for n in range(2):
            text = (tmp_path / f"worker-{n}.log").read_text()
            # One line when the wait starts per process that met it (main, work-horse, scheduler).
            assert 1 <= text.count("Redis is full") <= 3, text
            assert "accepts writes again" in text, text
            assert "Traceback" not in text, text
            assert " ERROR " not in text, text  # ridden out: WARNINGs only
        full.close()
    finally:
        stop([proc], grace=5)
