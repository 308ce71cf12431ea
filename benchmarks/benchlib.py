"""Shared plumbing for the benchmark, capacity and chaos scripts: a Redis of their own on a
free loopback port, child processes that are always cleaned up by pid, and exact command
counting (MONITOR for who sent what, client-side counting for round trips)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import redis
from redis.connection import Connection

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cli.devserver import free_port, start_redis  # noqa: E402


class OwnRedis:
    """A redis-server on a free loopback port with its own scratch directory."""

    def __init__(self, appendonly: bool = False):
        self.appendonly = appendonly
        self.dir = Path(tempfile.mkdtemp(prefix="leash-bench-redis-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> OwnRedis:
        self.proc, self.url = start_redis(self.dir, port=self.port, appendonly=self.appendonly)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def stop(self, kill: bool = False) -> None:
        """Stop Redis: SIGTERM (a clean shutdown that flushes the AOF) or SIGKILL (a crash)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self, down_seconds: float = 0.0) -> float:
        """Stop, stay down ``down_seconds``, start again on the same port and directory (the
        AOF reloads). Returns the seconds Redis did not answer."""
        began = time.monotonic()
        self.stop()
        time.sleep(down_seconds)
        self.start()
        return time.monotonic() - began

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Children:
    """Child processes (own session each); every pid seen, including work-horses and
    scheduler children, is killed at cleanup."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.known: set[int] = set()

    def start(self, argv: list[str], env: dict, root: Path = ROOT, **kwargs) -> subprocess.Popen:
        """Start ``argv`` in ``root`` (a checkout of leash: this one, or another version of
        it), with ``root`` first on PYTHONPATH."""
        env = dict(env)
        env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.Popen(argv, env=env, cwd=root, start_new_session=True, **kwargs)
        self.procs.append(proc)
        self.known.add(proc.pid)
        return proc

    def descendants(self, pid: int) -> list[int]:
        try:
            pids = [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        self.known.update(pids)
        return pids

    def signal_tree(self, proc: subprocess.Popen, sig: int) -> list[int]:
        """Send ``sig`` to a child and all its descendants (the horse is in its own group)."""
        pids = [proc.pid, *self.descendants(proc.pid)]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def cleanup(self) -> None:
        for proc in self.procs:
            self.descendants(proc.pid)
        for pid in self.known:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def wait_until(condition: Callable[[], object], timeout: float, interval: float = 0.02):
    """Poll until ``condition`` is truthy; returns its value, or None at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    return None


def worker_env(url: str, **extra: str) -> dict:
    env = dict(os.environ, REDIS_URL=url, LEASH_IMPORTS="benchmarks.chaos_kinds")
    env.update(extra)
    return env


class CommandCount:
    """What one piece of client code costs Redis: commands it sent, commands its Lua ran,
    and round trips (each send of a command or a pipeline)."""

    def __init__(self):
        self.client = Counter()
        self.lua = Counter()
        self.round_trips = 0

    def per(self, n: int) -> dict:
        return {
            "round_trips": round(self.round_trips / n, 2),
            "commands_sent": round(sum(self.client.values()) / n, 2),
            "commands_in_lua": round(sum(self.lua.values()) / n, 2),
            "commands_total": round((sum(self.client.values()) + sum(self.lua.values())) / n, 2),
            "sent": {k: round(v / n, 2) for k, v in sorted(self.client.items())},
        }


def count_commands(url: str, fn: Callable[[], None]) -> CommandCount:
    """Run ``fn`` under MONITOR on a Redis used by nothing else, counting exactly."""
    count = CommandCount()
    marker = f"leash-bench-end-{time.monotonic_ns()}"
    watcher = redis.Redis.from_url(url)
    ready = threading.Event()

    def listen():
        with watcher.monitor() as monitor:
            ready.set()
            for entry in monitor.listen():
                command = entry["command"]
                if marker in command:
                    return
                name = command.split(" ", 1)[0].strip('"').lower()
                if entry.get("client_type") == "lua":
                    count.lua[name] += 1
                else:
                    count.client[name] += 1

    closer = redis.Redis.from_url(url)
    closer.ping()  # connected before counting starts, so its handshake is not counted
    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.2)  # MONITOR is registered server-side once the listener has read its OK

    original = Connection.send_packed_command

    def counting(self, command, check_health=True):
        count.round_trips += 1
        return original(self, command, check_health)

    Connection.send_packed_command = counting
    try:
        fn()
    finally:
        Connection.send_packed_command = original
    closer.echo(marker)
    thread.join(10)
    watcher.close()
    closer.close()
    return count


def commandstats(client: redis.Redis) -> Counter:
    """Calls per command since the last CONFIG RESETSTAT (INFO commandstats)."""
    info = client.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items()})
