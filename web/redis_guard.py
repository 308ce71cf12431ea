"""Fail fast while Redis is unreachable.

Without this, every request that meets a silent Redis (stopped, partitioned, failing over)
waits its own ``LEASH_REDIS_TIMEOUT`` and holds one of the server's threads meanwhile, so the
requests behind it queue for many timeouts in a row. Instead the web process remembers the
first failure (``leash web`` is one process: every thread sees it at once):

    reachable ──a command times out or is refused──▶ unreachable
        ▲                                                 │ every Redis call fails at once
        │                                                 │ (RedisUnavailable: a 503 with
        └────── a background probe's PING is answered ◀───┘  Retry-After)

While unreachable, one daemon thread per process PINGs Redis every ``PROBE_INTERVAL`` seconds
on its own short-timeout connection; the first answer closes the breaker. Requests never wait
for the probe, and at most one probe is in flight per process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.retry import Retry

from jobs.core.store.connection import connect

log = logging.getLogger(__name__)

#: Seconds between two probes while Redis is unreachable (recovery is seen within about this).
PROBE_INTERVAL = 0.2
#: The longest a probe waits for its PING (a stalled Redis must not hold the probe either).
PROBE_TIMEOUT = 0.5
UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class RedisUnavailable(redis.exceptions.ConnectionError):
    """Raised at once, without touching the network, while the breaker is open."""


class Breaker:
    def __init__(self, probe: Callable[[], object], on_recovery: Callable[[], object] = lambda: None,
                 probe_interval: float = PROBE_INTERVAL):
        self._probe = probe
        self._on_recovery = on_recovery
        self._interval = probe_interval
        self._lock = threading.Lock()
        self._prober: threading.Thread | None = None
        #: monotonic time of the failure that opened the breaker; None while Redis answers
        self.down_since: float | None = None
        self.last_error = ""

    @property
    def open(self) -> bool:
        return self.down_since is not None

    def check(self) -> None:
        if self.down_since is not None:
            raise RedisUnavailable(f"Redis did not answer ({self.last_error}); failing fast until it answers again")

    def trip(self, error: BaseException) -> None:
        with self._lock:
            if self.down_since is not None:
                return
            self.down_since = time.monotonic()
            self.last_error = str(error)[:200]
            log.warning("Redis unreachable (%s): answering 503 at once until a probe sees it again", error)
            self._prober = threading.Thread(target=self._probe_until_answered, name="leash-redis-probe", daemon=True)
            self._prober.start()

    def _probe_until_answered(self) -> None:
        while True:
            time.sleep(self._interval)
            try:
                self._probe()
            except redis.exceptions.RedisError:
                continue
            try:
                self._on_recovery()
            finally:
                with self._lock:
                    outage = time.monotonic() - (self.down_since or time.monotonic())
                    self.down_since = None
                    self._prober = None
                log.warning("Redis answers again after %.1f s", outage)
            return


class GuardedPipeline(Pipeline):
    breaker: Breaker

    def execute(self, raise_on_error: bool = True):
        self.breaker.check()
        try:
            return super().execute(raise_on_error)
        except UNREACHABLE as exc:
            self.breaker.trip(exc)
            raise


class GuardedRedis(redis.Redis):
    """A client whose every command and pipeline goes through the breaker first."""

    breaker: Breaker

    def execute_command(self, *args, **options):
        self.breaker.check()
        try:
            return super().execute_command(*args, **options)
        except UNREACHABLE as exc:
            self.breaker.trip(exc)
            raise

    def pipeline(self, transaction: bool = True, shard_hint=None) -> Pipeline:
        pipe = GuardedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.breaker = self.breaker
        return pipe


def guarded_connection(url: str | None, timeout: float) -> GuardedRedis:
    """The web app's client: commands wait at most ``timeout`` seconds, are never retried after
    a timeout (that would double the wait), and a refused or broken connection is retried once
    (a pooled socket that a Redis restart closed)."""
    once_if_refused = Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))
    client = connect(url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=once_if_refused,
                     client_class=GuardedRedis)
    probe_timeout = min(timeout, PROBE_TIMEOUT)
    prober = connect(url, socket_timeout=probe_timeout, socket_connect_timeout=probe_timeout,
                     retry=Retry(NoBackoff(), 0), health_check_interval=0)

    def probe() -> None:
        prober.ping()

    def recovered() -> None:
        # Idle pooled sockets may be dead (Redis restarted): drop them, in-use ones finish.
        client.connection_pool.disconnect(inuse_connections=False)
        prober.connection_pool.disconnect()

    client.breaker = Breaker(probe, recovered)
    return client
