"""Redis behind Sentinel: ``REDIS_URL=redis+sentinel://[[user]:password@]host:port[,host:port...]/<service>[/db]``.

The URL names the Sentinels (port 26379 when left out), the service (the name the Sentinels
monitor, ``sentinel monitor <service> ...``) and the database. The user and password are the
Redis primary's; Sentinels that have a password of their own take ``?sentinel_password=``.
``rediss+sentinel://`` speaks TLS to the Sentinels and to Redis (certificates unchecked unless
``?ssl_cert_reqs=required``, as for ``rediss://``; ``&ssl_ca_certs=`` for a private CA).

Connections come from redis-py's ``Sentinel(...).master_for(service)``: every new connection
asks the Sentinels where the primary is, a connection to a primary that was demoted is closed
at its first refused write (READONLY) and one to a dead primary at its first error, so the
next command reaches the new primary. Its pool survives a fork (RQ's work-horse) by starting
empty in the child, which then asks the Sentinels afresh.

This module parses and checks the URL (``problem``, used by jobs.config for every setting of
type redis_url) and builds the client (``connect``, used by jobs.core.connection).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

from redis import Redis
from redis.sentinel import Sentinel, SentinelConnectionPool
from rq.connections import get_connection_kwargs

SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_PORT = 26379
EXAMPLE = "redis+sentinel://sentinel-1:26379,sentinel-2:26379/mymaster/0"
#: Query options the URL may carry; anything else is a mistake worth naming.
OPTIONS = ("sentinel_password", "ssl_cert_reqs", "ssl_ca_certs")
#: The longest one question to one Sentinel may take: a dead Sentinel of three must not hold
#: up every reconnect for a whole command timeout.
SENTINEL_TIMEOUT = 2.0


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    options: dict[str, str] = field(default_factory=dict)


def is_sentinel(url: str) -> bool:
    return url.partition("://")[0].lower() in SCHEMES


def parse(url: str) -> SentinelUrl:
    """The parts of a Sentinel URL; a ValueError saying what is wrong (never repeating the URL,
    which may carry a password)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise ValueError(f"must start with {' or '.join(s + '://' for s in SCHEMES)}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    sentinels = [_host_port(part) for part in hosts.split(",")]
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path:
        raise ValueError("names no service: put the name the Sentinels monitor after the hosts")
    if len(path) > 2:
        raise ValueError("has too much path: only /<service> and an optional /<db> follow the hosts")
    db = 0
    if len(path) == 2:
        if not (path[1].isascii() and path[1].isdigit()):
            raise ValueError("has a database that is not a number: /<service>/<db>, e.g. /mymaster/0")
        db = int(path[1])
    options = {}
    for name, values in parse_qs(parts.query, keep_blank_values=True).items():
        if name not in OPTIONS:
            raise ValueError(f"has an option Sentinel URLs do not take ({name}); they take {', '.join(OPTIONS)}")
        options[name] = values[-1]
    return SentinelUrl(sentinels, path[0], db, unquote(username) or None, unquote(password) or None,
                       tls=parts.scheme.lower() == "rediss+sentinel", options=options)


def _host_port(text: str) -> tuple[str, int]:
    text = text.strip()
    if text.startswith("["):  # [::1]:26379
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") or str(DEFAULT_PORT)
    else:
        host, colon, port = text.rpartition(":")
        if not colon:
            host, port = text, str(DEFAULT_PORT)
    if not host:
        raise ValueError("has an empty Sentinel address: list them as host:port,host:port")
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError("has a Sentinel port that is not a number from 1 to 65535")
    return host, int(port)


def problem(url: str) -> str | None:
    """Why ``url`` is not a usable Sentinel URL, or None."""
    try:
        parse(url)
    except ValueError as exc:
        return f"is not a Sentinel URL: it {exc}; write it like {EXAMPLE}"
    return None


def connect(url: str, client_class: type[Redis] = Redis, **kwargs) -> Redis:
    """A client of the service's current primary, following it through failovers."""
    parsed = parse(url)
    tls = {}
    if parsed.tls:
        tls = {"ssl": True, "ssl_cert_reqs": None}  # as for rediss:// (jobs.core.connection)
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
