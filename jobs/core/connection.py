"""How leash reaches Redis: ``REDIS_URL``, a Redis URL or a Sentinel URL (jobs/core/sentinel.py).

``rediss://`` (TLS) does not check the server's certificate unless the URL asks for it:
Heroku Redis presents a self-signed one that cannot be checked. Options in the URL win over
these defaults (redis-py merges them last), so ``rediss://...?ssl_cert_reqs=required`` (plus
``&ssl_ca_certs=/path/to/ca.pem`` for a private CA) turns checking on.
"""

from __future__ import annotations

import re

import redis
from redis import Redis

from jobs import config
from jobs.core import sentinel

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def redis_url() -> str:
    return config.get("REDIS_URL") or DEFAULT_URL


def connect(url: str | None = None, client_class: type[Redis] = Redis, **kwargs) -> Redis:
    url = url or redis_url()
    kwargs.setdefault("health_check_interval", 30)
    kwargs.setdefault("socket_connect_timeout", 5)
    if sentinel.is_sentinel(url):
        return sentinel.connect(url, client_class, **kwargs)
    if url.startswith("rediss://"):
        # Heroku Redis presents a self-signed certificate.
        kwargs.setdefault("ssl_cert_reqs", None)
    return client_class.from_url(url, **kwargs)



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
