"""How leash reaches Redis: ``REDIS_URL``, a Redis URL or a Sentinel URL (parsed in jobs.core.store.redis_url).

Behind Sentinel every client is redis-py's ``Sentinel(...).master_for(service)``: each new
connection asks the Sentinels where the primary is; a connection to a primary that was
demoted is closed at its first refused write (READONLY), one to a dead primary at its first
error, so the next command reaches the new primary. The pool survives a fork (RQ's
work-horse) by starting empty in the child, which then asks the Sentinels afresh.

``rediss://`` (TLS) does not check the server's certificate unless the URL asks for it:
Heroku Redis presents a self-signed one that cannot be checked. Options in the URL win over
these defaults (redis-py merges them last), so ``rediss://...?ssl_cert_reqs=required`` (plus
``&ssl_ca_certs=/path/to/ca.pem`` for a private CA) turns checking on.
"""

from __future__ import annotations

import re

import redis
from redis import Redis
from redis.sentinel import Sentinel, SentinelConnectionPool
from rq.connections import get_connection_kwargs

from jobs import config
from jobs.core.store.redis_url import is_sentinel_url, parse_sentinel_url, redis_url_problem

DEFAULT_URL = "redis://127.0.0.1:6379/0"
#: The longest one question to one Sentinel may take: a dead Sentinel of three must not hold
#: up every reconnect for a whole command timeout.
SENTINEL_TIMEOUT = 2.0


def configured_url() -> str | None:
    """REDIS_URL as set (None when unset); one redis-py cannot use is a ValueError naming the
    variable, never repeating the URL (it may carry a password)."""
    url = config.redis_settings().redis_url
    if url is not None and (problem := redis_url_problem(url)):
        raise ValueError(f"REDIS_URL {problem}")
    return url


def check_settings() -> None:
    """Every setting parses, REDIS_URL first: a bad value fails at start (the CLI's exit 2, the
    web app refusing to start), not in the middle of a job."""
    configured_url()
    config.check_all()


def redis_url() -> str:
    return configured_url() or DEFAULT_URL


def connect(url: str | None = None, client_class: type[Redis] = Redis, **kwargs) -> Redis:
    url = url or redis_url()
    kwargs.setdefault("health_check_interval", 30)
    kwargs.setdefault("socket_connect_timeout", 5)
    if is_sentinel_url(url):
        return _sentinel_client(url, client_class, **kwargs)
    if url.startswith("rediss://"):
        # Heroku Redis presents a self-signed certificate.
        kwargs.setdefault("ssl_cert_reqs", None)
    return client_class.from_url(url, **kwargs)


def _sentinel_client(url: str, client_class: type[Redis], **kwargs) -> Redis:
    """A client of the service's current primary, following it through failovers."""
    parsed = parse_sentinel_url(url)
    tls = {}
    if parsed.tls:
        tls = {"ssl": True, "ssl_cert_reqs": None}  # as for rediss://, below
        if "ssl_cert_reqs" in parsed.options:
            tls["ssl_cert_reqs"] = parsed.options["ssl_cert_reqs"]
        if "ssl_ca_certs" in parsed.options:
            tls["ssl_ca_certs"] = parsed.options["ssl_ca_certs"]
    timeout = min([SENTINEL_TIMEOUT] + [t for t in (kwargs.get("socket_timeout"),
                                                    kwargs.get("socket_connect_timeout")) if t])
    sentinel = Sentinel(parsed.sentinels, sentinel_kwargs={
        "socket_timeout": timeout, "socket_connect_timeout": timeout,
        "password": parsed.options.get("sentinel_password"), **tls})
    return sentinel.master_for(parsed.service, redis_class=client_class, db=parsed.db,
                               username=parsed.username, password=parsed.password, **tls, **kwargs)


def is_sentinel_client(client: Redis | None) -> bool:
    return client is not None and isinstance(client.connection_pool, SentinelConnectionPool)


def follow_primary(client: Redis) -> None:
    """Ask the Sentinels where the primary is now; if it moved, close ``client``'s idle
    connections (a connection in use is closed when it is given back). Needed after a planned
    switch (SENTINEL FAILOVER), when the old primary stays up and keeps accepting writes
    until the Sentinels demote it some seconds later: a long-lived client that never
    reconnects would go on writing there, and those writes are lost at the demotion. Raises
    redis's ConnectionError when no Sentinel names a primary. Nothing for other clients."""
    if is_sentinel_client(client):
        client.connection_pool.get_master_address()


def rebuilt(client: Redis) -> Redis | None:
    """A new client with a pool of its own for the primary ``client`` follows (None when
    ``client`` is not a Sentinel client). For a forked process that builds its own client from
    another's settings, as RQ's retry scheduler does: copying the pool's settings alone would
    keep the Sentinel lookup but lose the pool's check that closes connections to a former
    primary."""
    if not is_sentinel_client(client):
        return None
    pool = client.connection_pool
    kwargs = {k: v for k, v in get_connection_kwargs(client).items() if k != "connection_pool"}
    return pool.sentinel_manager.master_for(pool.service_name, redis_class=type(client),
                                            connection_class=pool.connection_class, **kwargs)


_PASSWORD_IN_QUERY = re.compile(r"(?i)([?&](?:sentinel_)?password=)[^&#]*")


def masked(url: str) -> str:
    """The URL with any password replaced by ``***``, for every message and banner. Works on
    text only (no URL parser), so a URL too malformed to parse is masked all the same."""
    scheme, separator, rest = url.partition("://")
    if separator:
        netloc, slash, tail = rest.partition("/")
        userinfo, at, host = netloc.rpartition("@")
        if at and ":" in userinfo:
            netloc = userinfo.split(":", 1)[0] + ":***@" + host
        url = scheme + separator + netloc + slash + tail
    return _PASSWORD_IN_QUERY.sub(r"\1***", url)


def is_out_of_memory(exc: BaseException) -> bool:
    """Redis at maxmemory with a no-eviction policy refuses writes ("OOM command not allowed");
    in a pipeline the refusal arrives wrapped in the pipeline's error text."""
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or "OOM command not allowed" in str(exc)
