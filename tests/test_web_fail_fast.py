"""While Redis does not answer, the web app says so at once: after the first timeout every
request is a 503 with Retry-After in milliseconds, until a background probe sees Redis answer
again (within a second). Redis is stalled with SIGSTOP: it accepts connections, answers
nothing, exactly like a hung or partitioned server.

Run with ``-s`` to see the latencies (they are in docs/BENCHMARKS.md)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cli.devserver import start_redis
from jobs.core.store.connection import connect
from jobs.enqueue import enqueue
from tests.conftest import ROOT, wait_for
from tests.web_support import CLASSIFY, basic, create_app_with

pytestmark = pytest.mark.slow

REDIS_TIMEOUT = 2.0


class StallableRedis:
    """A redis-server of the test's own that can be stopped (SIGSTOP) and resumed."""

    def __init__(self, workdir):
        self.proc, self.url = start_redis(workdir)

    def stall(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.resume()
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def stallable_redis(tmp_path, env):
    server = StallableRedis(tmp_path)
    yield server
    server.close()


def _timed(call):
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def test_after_the_first_timeout_requests_are_a_503_at_once_and_recover_when_redis_answers(stallable_redis):
    client = create_app_with(REDIS_URL=stallable_redis.url, LEASH_REDIS_TIMEOUT=REDIS_TIMEOUT).test_client()
    job_id = client.post("/jobs", json=CLASSIFY).get_json()["job_id"]
    stallable_redis.stall()

    first, first_took = _timed(lambda: client.get(f"/jobs/{job_id}"))
    assert first.status_code == 503 and first.headers["Retry-After"]
    assert REDIS_TIMEOUT * 0.9 <= first_took <= REDIS_TIMEOUT + 1
    later = [_timed(lambda: client.get(f"/jobs/{job_id}")) for _ in range(20)]
    later += [_timed(lambda: client.post("/jobs", json=CLASSIFY)) for _ in range(5)]
    for response, took in later:
        assert response.status_code == 503 and response.headers["Retry-After"], response.data
        assert "unreachable" in response.get_json()["error"]
        assert took < REDIS_TIMEOUT / 2, took  # never a wait for Redis (a loaded machine may be slow)
    assert statistics.median(took for _, took in later) < 0.1
    metrics, took = _timed(lambda: client.get("/metrics"))
    assert metrics.status_code == 200 and b"leash_redis_up 0.0" in metrics.data and took < REDIS_TIMEOUT / 2

    stallable_redis.resume()
    resumed = time.monotonic()
    wait_for(lambda: client.get(f"/jobs/{job_id}").status_code == 200, 5, interval=0.02, message="recovery")
    assert time.monotonic() - resumed < 1.0
    assert client.post("/jobs", json=CLASSIFY).status_code == 202


def test_a_refused_connection_also_opens_the_breaker_and_a_restart_closes_it(stallable_redis, tmp_path):
    client = create_app_with(REDIS_URL=stallable_redis.url, LEASH_REDIS_TIMEOUT=REDIS_TIMEOUT).test_client()
    assert client.get("/healthz").status_code == 200
    port = stallable_redis.url.rsplit(":", 1)[1].split("/")[0]
    stallable_redis.proc.kill()
    stallable_redis.proc.wait(timeout=10)
    assert client.get("/healthz").status_code == 503
    response, took = _timed(lambda: client.get("/healthz"))
    assert response.status_code == 503 and took < REDIS_TIMEOUT / 2
    stallable_redis.proc, _ = start_redis(tmp_path, port=int(port))
    # The pooled sockets died with the old server; the first requests after it returns succeed anyway.
    wait_for(lambda: client.get("/healthz").status_code == 200, 5, interval=0.02, message="recovery")
    assert client.post("/jobs", json=CLASSIFY).status_code == 202


def _burst(url_host: int, path: str, count: int) -> list[tuple[int, float, str | None]]:
    def one(_):
        connection = http.client.HTTPConnection("127.0.0.1", url_host, timeout=30)
        started = time.monotonic()
        try:
            connection.request("GET", path, headers={"Accept": "application/json"})
            response = connection.getresponse()
            body = response.read()
            took = time.monotonic() - started
            if response.status == 503:
                assert json.loads(body)["error"]
            return response.status, took, response.getheader("Retry-After")
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count)))


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


RUNS = 10


def test_once_one_request_met_the_stall_32_concurrent_reads_are_fast_503s_in_every_run(stallable_redis, web_server):
    # The web process as the Procfile starts it (`leash web`): one process, so the thread that
    # met the stall and every other thread share one breaker. Ten stalls in a row, each checked.
    server = web_server(extra_env={"REDIS_URL": stallable_redis.url, "LEASH_REDIS_TIMEOUT": str(REDIS_TIMEOUT)})
    client = create_app_with(REDIS_URL=stallable_redis.url).test_client()
    job_id = client.post("/jobs", json=CLASSIFY).get_json()["job_id"]
    path = f"/jobs/{job_id}"
    assert all(status == 200 for status, _, _ in _burst(server.port, path, 32))  # the pool warm

    runs = []
    for run in range(RUNS):
        stallable_redis.stall()
        try:
            met = _burst(server.port, path, 1)  # one request meets the stall: a full timeout
            known = _burst(server.port, path, 32)
        finally:
            stallable_redis.resume()
        resumed = time.monotonic()
        # Ten answers in a row: the probe has seen Redis again.
        wait_for(lambda: all(status == 200 for status, _, _ in _burst(server.port, path, 10)), 10, interval=0.02,
                 message=f"run {run}: the web process to answer again")
        recovery = time.monotonic() - resumed
        latencies = [took for _, took, _ in known]
        runs.append((met[0][1], statistics.median(latencies), _quantile(latencies, 0.99), max(latencies), recovery))
        assert met[0][0] == 503 and met[0][2], met
        assert all(status == 503 and retry_after for status, _, retry_after in known), (run, known)

    print(f"\nstall, LEASH_REDIS_TIMEOUT={REDIS_TIMEOUT:g}, {RUNS} runs: the request that met it / "
          "32 concurrent reads once known p50, p99, max / recovery after SIGCONT")
    for n, (first, p50, p99, most, recovery) in enumerate(runs, 1):
        print(f"  run {n:2d}: {first * 1000:5.0f} ms / p50 {p50 * 1000:5.1f} ms, p99 {p99 * 1000:6.1f} ms, "
              f"max {most * 1000:6.1f} ms / {recovery * 1000:4.0f} ms")
    for n, (first, p50, _, most, recovery) in enumerate(runs, 1):
        assert REDIS_TIMEOUT * 0.9 <= first <= REDIS_TIMEOUT + 1, (n, first)
        # Once the stall is known no read waits on Redis: every answer comes well inside one timeout
        # (typically 2-30 ms; a loaded machine has stretched the median to ~150 ms, so the bound is
        # the behaviour, not the speed: the figures above and docs/BENCHMARKS.md give the speed).
        assert most < REDIS_TIMEOUT / 2, (n, most)
        assert p50 < REDIS_TIMEOUT / 4, (n, p50)
        assert recovery < 1.0, (n, recovery)


def _read_by_server(server_port: int, client_port: int) -> bool:
    """The server's side of this connection exists and has nothing left unread (Linux's table of
    TCP sockets): the request was taken in."""
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        local, remote, queues = fields[1], fields[2], fields[4]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            return int(queues.split(":")[1], 16) == 0
    return False


def test_a_deploys_sigterm_answers_the_requests_already_received_then_the_server_exits(stallable_redis,
                                                                                        web_server):
    server = web_server(extra_env={"REDIS_URL": stallable_redis.url, "LEASH_REDIS_TIMEOUT": str(REDIS_TIMEOUT)})
    client = create_app_with(REDIS_URL=stallable_redis.url).test_client()
    job_id = client.post("/jobs", json=CLASSIFY).get_json()["job_id"]
    stallable_redis.stall()  # the request below then takes LEASH_REDIS_TIMEOUT in the app
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("GET", f"/jobs/{job_id}", headers={"Accept": "application/json"})
        client_port = connection.sock.getsockname()[1]
        wait_for(lambda: _read_by_server(server.port, client_port), 10, interval=0.01,
                 message="the server to take the request in")
        server.proc.send_signal(signal.SIGTERM)
        response = connection.getresponse()
        assert response.status == 503 and json.loads(response.read())["error"]
    finally:
        connection.close()
    assert server.proc.wait(timeout=REDIS_TIMEOUT + 10) == 0
    try:
        http.client.HTTPConnection("127.0.0.1", server.port, timeout=2).request("GET", "/healthz")
        accepted = True
    except OSError:
        accepted = False
    assert not accepted  # nothing listens once it has stopped


def test_rq_dashboard_pages_are_a_503_at_once_while_the_stall_is_known(stallable_redis):
    client = create_app_with(REDIS_URL=stallable_redis.url, LEASH_REDIS_TIMEOUT=REDIS_TIMEOUT,
                             LEASH_DASHBOARD_USER="ops", LEASH_DASHBOARD_PASSWORD="ops-password-123").test_client()
    auth = basic("ops", "ops-password-123")
    assert client.get("/rq/", headers=auth).status_code == 200
    stallable_redis.stall()
    assert client.get("/healthz").status_code == 503  # the first timeout: the stall is known
    refused = client.get("/rq/", headers={"Accept": "application/json"})
    assert refused.status_code == 401  # still no dashboard without its password
    response, took = _timed(lambda: client.get("/rq/", headers={"Accept": "application/json", **auth}))
    assert response.status_code == 503 and response.headers["Retry-After"] and took < REDIS_TIMEOUT / 2


def test_a_leash_command_whose_redis_stalls_mid_command_ends_in_one_line_and_exit_3(stallable_redis, tmp_path):
    # `leash watch` is connected and polling when Redis stops answering (hung or partitioned):
    # its next call gives up after LEASH_REDIS_TIMEOUT (1 s here; redis-py's own default is 5 s).
    job_id, _ = enqueue(connect(stallable_redis.url), "classify", {"items": ["x"], "labels": ["a", "b"]})
    environment = {**os.environ, "REDIS_URL": stallable_redis.url, "LEASH_REDIS_TIMEOUT": "1",
                   "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path)}
    out, err = tmp_path / "watch.out", tmp_path / "watch.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        watch = subprocess.Popen([sys.executable, "-m", "cli", "watch", job_id], env=environment, cwd=ROOT,
                                 stdout=stdout, stderr=stderr)
    try:
        wait_for(lambda: "queued" in out.read_text(), 20, message="leash watch's first line")
        stallable_redis.stall()
        stalled = time.monotonic()
        code = watch.wait(timeout=REDIS_TIMEOUT + 20)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(timeout=10)
    message = err.read_text()
    assert code == 3, message  # cannot reach Redis (docs/CLI.md)
    assert "Traceback" not in message and len(message.strip().splitlines()) == 1, message
    assert f"Redis at {stallable_redis.url}" in message and "Timeout" in message, message
    assert time.monotonic() - stalled < 4.0  # its next poll within 1 s, then 1 s of waiting
