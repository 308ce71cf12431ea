"""Redis goes away mid-job and comes back: the web app answers 503 JSON meanwhile, the worker
stays up without spinning, and the job is finished afterwards — never lost (AOF on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import redis

from cli.devserver import free_port, start_redis
from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from tests.conftest import ROOT, wait_for
from tests.kinds_for_tests import item_calls

pytestmark = pytest.mark.slow

OUTAGE_SECONDS = 8.0
ITEMS = [f"item-{i}" for i in range(25)]


class OwnRedis:
    """A redis-server of this test's own (appendonly yes), stoppable and restartable."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.port = free_port()
        self.proc, self.url = start_redis(workdir, port=self.port, appendonly=True)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=15)

    def start(self):
        self.proc, self.url = start_redis(self.workdir, port=self.port, appendonly=True)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path, env):
    server = OwnRedis(tmp_path)
    env.setenv("REDIS_URL", server.url)
    yield server
    server.close()


@pytest.fixture
def worker_proc(own_redis, tmp_path):
    log_path = tmp_path / "worker.log"
    env = dict(os.environ, REDIS_URL=own_redis.url, PYTHONPATH=str(ROOT))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "worker", "--name", "outage-worker"],
                                env=env, cwd=ROOT, start_new_session=True, stdout=log, stderr=log)
    seen: set[int] = {proc.pid}
    proc.log_path = log_path
    proc.seen = seen
    yield proc
    for pid in seen | _descendants(proc.pid):
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    proc.wait(timeout=10)


def _descendants(pid: int) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _cpu_seconds(pid: int, seen: set[int]) -> float:
    total = 0.0
    seen.update(_descendants(pid))
    for p in [pid, *_descendants(pid)]:
        try:
            times = psutil.Process(p).cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def _web_client(url: str):
    from tests.web_support import create_app_with

    return create_app_with(REDIS_URL=url, LEASH_API_TOKENS="").test_client()


def test_worker_and_web_ride_out_a_redis_outage_and_the_job_still_finishes(own_redis, worker_proc):
    conn = redis.Redis.from_url(own_redis.url)
    web = _web_client(own_redis.url)
    job_id, _ = enqueue(conn, "count", {"items": ITEMS, "delay": 0.2, "effect": True, "item_concurrency": 2},
                        owner="shared")
    assert web.get("/healthz").status_code == 200
    wait_for(lambda: int(conn.hget(keys.job(job_id), "done") or 0) >= 3, 30, message="progress before the outage")

    cpu_before = _cpu_seconds(worker_proc.pid, worker_proc.seen)
    own_redis.stop()
    down_at = time.monotonic()

    health = web.get("/healthz")
    assert health.status_code == 503 and health.is_json and health.get_json().get("error")
    status = web.get(f"/jobs/{job_id}", headers={"Accept": "application/json"})
    assert status.status_code == 503, status.data[:300]
    assert status.is_json and "error" in status.get_json()

    while time.monotonic() - down_at < OUTAGE_SECONDS:
        assert worker_proc.poll() is None, "the worker exited while Redis was down"
        time.sleep(0.5)
    outage = time.monotonic() - down_at
    cpu_share = (_cpu_seconds(worker_proc.pid, worker_proc.seen) - cpu_before) / outage
    assert cpu_share < 0.20, f"the worker used {cpu_share:.0%} of a core while Redis was down"
    log = worker_proc.log_path.read_text()
    retries = log.count("could not connect to Redis")
    assert 1 <= retries <= 3 * OUTAGE_SECONDS, f"{retries} reconnect attempts in {outage:.1f}s"

    own_redis.start()
    # The web app answers 503 at once until its background probe sees Redis again (0.2 s).
    wait_for(lambda: web.get("/healthz").status_code == 200, 5, interval=0.1, message="the web app to see Redis again")
    final = wait_for(lambda: (s := states.status(conn, job_id))["state"] in ("succeeded", "failed") and s, 60,
                     message="the job to end after Redis came back")
    assert final["state"] == "succeeded", final["error"]
    assert final["done"] == final["total"] == len(ITEMS)
    assert sorted(int(k) for k in conn.hkeys(keys.items(job_id))) == list(range(len(ITEMS)))
    assert final["attempts"] <= 2
    assert int(conn.get(f"test:effect:{job_id}") or 0) == 1
    # Checkpoints survived the restart (AOF): no item was computed more than twice.
    assert max(item_calls(conn, job_id).values()) <= 2
    assert worker_proc.poll() is None, "the worker did not survive the outage"
    # Ridden out, so nothing at ERROR (an alert on ERROR must not fire), and a WARNING says what
    # the worker is doing meanwhile and for how long.
    log = worker_proc.log_path.read_text()
    assert [line for line in log.splitlines() if "ERROR" in line or "Traceback" in line] == [], log[-3000:]
    assert "WARNING" in log and "could not connect to Redis" in log
    conn.close()
