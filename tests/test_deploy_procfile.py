"""The Procfile as a platform runs it: honcho (a Procfile runner, like Heroku's and Dokku's)
starts ``web`` and ``worker`` from the Procfile itself, a job submitted over HTTP runs end to
end, and one SIGTERM — a deploy — stops everything within honcho's grace period (5 s before it
would SIGKILL; Heroku's is 30 s), with the running job handed back to the queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from cli.devserver import free_port
from jobs import keys
from jobs.core import states
from tests.conftest import REDIS_URL, ROOT, wait_for

pytestmark = pytest.mark.slow

HONCHO_GRACE = 5  # honcho's KILL_WAIT: SIGKILL this long after SIGTERM


def http(url: str, data: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(data).encode() if data is not None else None,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, json.loads(response.read())


def answers(url: str) -> bool:
    try:
        return http(url)[0] == 200
    except OSError:
        return False


class Honcho:
    def __init__(self, tmp_path: Path, env: dict):
        self.output = tmp_path / "honcho.log"
        self.seen: set[int] = set()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "honcho", "start", "--no-colour", "-f", str(ROOT / "Procfile"), "-d", str(ROOT)],
            cwd=tmp_path, env=env, stdout=self.output.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.seen.add(self.proc.pid)

    def descendants(self) -> set[int]:
        try:
            pids = {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pids = set()
        self.seen |= pids
        return pids

    def log(self) -> str:
        return self.output.read_text()

    def cleanup(self) -> None:
        self.descendants()
        for pid in self.seen:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        self.proc.wait(timeout=10)


@pytest.fixture
def honcho(conn, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASH_", "SENTRY_"))}
    env.update(
        PORT=str(port),  # honcho gives it to web (and PORT+100 to worker)
        REDIS_URL=REDIS_URL, SECRET_KEY="procfile-test-secret",
        # The Procfile's `leash` is this environment's console script.
        PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        PYTHONPATH=str(ROOT), LEASH_IMPORTS="tests.kinds_for_tests",
        LEASH_LEASE_SECONDS="4", LEASH_LOCAL_DELAY_MS="10",
    )
    runner = Honcho(tmp_path, env)
    runner.url = f"http://127.0.0.1:{port}"
    try:
        yield runner
    finally:
        runner.cleanup()


def test_honcho_runs_the_procfile_a_job_runs_end_to_end_and_sigterm_stops_everything_in_time(honcho, conn):
    wait_for(lambda: answers(honcho.url + "/healthz"), 60, interval=0.2,
             message="the Procfile's web process to answer /healthz")
    status, body = http(honcho.url + "/jobs", {"kind": "classify", "items": ["I love it", "it is broken"],
                                               "labels": ["positive", "negative"]})
    assert status == 202
    final = wait_for(lambda: (s := http(honcho.url + f"/jobs/{body['job_id']}")[1])["state"] == "succeeded" and s,
                     60, interval=0.2, message="the job to succeed on the Procfile's worker")
    assert final["result"]["summary"]["labels"] == {"positive": 1, "negative": 1}

    # A long job is running when the deploy's SIGTERM arrives.
    status, long_job = http(honcho.url + "/jobs", {"kind": "count", "items": [f"i{n}" for n in range(200)],
                                                   "delay": 0.2})
    assert status == 202
    wait_for(lambda: (s := http(honcho.url + f"/jobs/{long_job['job_id']}")[1])["state"] == "running"
             and s["done"] >= 1, 30, message="the long job to be running")
    processes = honcho.descendants()
    assert len(processes) >= 3, honcho.log()  # leash web, leash worker and its work-horse

    started = time.monotonic()
    honcho.proc.send_signal(signal.SIGTERM)
    honcho.proc.wait(timeout=HONCHO_GRACE + 10)
    log = honcho.log()
    assert "SIGKILL" not in log, log  # every process stopped by itself inside honcho's grace period
    assert time.monotonic() - started < HONCHO_GRACE, log
    assert "web.1 stopped" in log and "worker.1 stopped" in log, log
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                             for p in honcho.seen - {honcho.proc.pid}), 5, message="every Procfile process to exit")
    after = states.status(conn, long_job["job_id"])
    assert after["state"] == "queued" and after["attempts"] == 0, after  # handed back, no attempt spent
    assert 1 <= after["done"] < 200
    assert conn.hget(keys.job(long_job["job_id"]), "handoffs") == b"1"
