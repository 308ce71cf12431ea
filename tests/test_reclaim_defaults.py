"""On default settings (lease, renewal, reaper tick), a dead or frozen worker's running job is
running again under another worker within 35 s, and a live job whose model call outlasts the
lease keeps it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from jobs import keys
from jobs.core.store.connection import connect
from jobs.enqueue import enqueue
from tests.conftest import REDIS_URL, wait_for
from tests.fake_openai import FakeOpenAI, Slow, serving

pytestmark = pytest.mark.slow

WITHIN = 35.0


@pytest.fixture
def defaults(env):
    """The lease and everything timed from it as shipped (conftest shortens them)."""
    env.delenv("LEASH_LEASE_SECONDS")
    return env


def _holder(conn, job_id: str) -> tuple[str, str] | None:
    state, worker, done = conn.hmget(keys.job(job_id), "state", "worker", "done")
    if state == b"running" and worker and int(done or 0) >= 2:
        return worker.decode(), conn.hget(keys.job(job_id), "token").decode()
    return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
def test_a_dead_or_frozen_workers_job_runs_again_elsewhere_within_35_s_on_defaults(defaults, workers, conn, how):
    defaults.setenv("LEASH_LOCAL_DELAY_MS", "300")  # the workload, not a lease setting
    procs = {name: workers.start("--name", name, "--no-scheduler") for name in ("first", "second")}
    job_id, _ = enqueue(conn, "classify", {"items": [f"item {i}" for i in range(400)], "labels": ["a", "b"]})
    name, token = wait_for(lambda: _holder(conn, job_id), 30, message="the job running")
    victim = procs[name]
    pids = [victim.pid, *workers.children(victim)]
    for pid in pids:  # the whole machine: the worker and its work-horse
        signal_pid(pid, signal.SIGKILL if how == "sigkill" else signal.SIGSTOP)
    stopped = time.monotonic()

    def running_elsewhere():
        state, worker, now_token = conn.hmget(keys.job(job_id), "state", "worker", "token")
        return state == b"running" and worker and worker.decode() != name and now_token.decode() != token

    wait_for(running_elsewhere, WITHIN, interval=0.1, message=f"the job running again within {WITHIN:g} s")
    took = time.monotonic() - stopped
    print(f"{how}: running again under another worker after {took:.1f} s")
    assert conn.hget(keys.job(job_id), "attempts") == b"2"


def signal_pid(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


@pytest.fixture
def slow_call_model(env):
    yield from serving(env, FakeOpenAI())


@pytest.mark.timeout(120)
def test_a_model_call_three_leases_long_keeps_the_job_on_defaults(defaults, workers, conn, slow_call_model):
    defaults.setenv("LEASH_MODEL_TIMEOUT", "90")
    slow_call_model.on("slow -> a", Slow(65))  # over three default leases
    workers.start("--name", "only", "--no-scheduler")
    client = connect(REDIS_URL)
    job_id, _ = enqueue(client, "classify", {"items": ["slow -> a"], "labels": ["a", "b"]})
    wait_for(lambda: conn.hget(keys.job(job_id), "state") in (b"succeeded", b"failed"), 100, interval=0.5,
             message="the slow job ended")
    job = conn.hgetall(keys.job(job_id))
    assert job[b"state"] == b"succeeded" and job[b"attempts"] == b"1", job
    assert int(conn.get(keys.RECLAIMS) or 0) == 0 and len(slow_call_model.seen("slow -> a")) == 1
