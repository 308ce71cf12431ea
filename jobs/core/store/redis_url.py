"""What a Redis URL may look like: ``redis://``, ``rediss://``, ``unix://`` or a Sentinel URL.

Text only (no Redis, no settings): jobs.core.store.connection checks REDIS_URL with it and builds
the client; the command line says the same about a URL it was given, masked (cli/redis_target.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit


def redis_url_problem(text: str) -> str | None:
    """Why ``text`` is not a URL redis-py can use (never repeating it: it may carry a
    password), or None. The CLI says the same with the URL masked (cli/redis_target.py)."""
    if is_sentinel_url(text):
        return _sentinel_url_problem(text)
    example = "redis://localhost:6379/0"
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - parsing the port is what raises for "host:abc"
    except ValueError as exc:
        return f"is not a Redis URL ({exc}); write it like {example}"
    if parts.scheme not in ("redis", "rediss", "unix"):
        return (f"is not a Redis URL: it must start with redis://, rediss://, unix:// or "
                f"redis+sentinel://, e.g. {example}")
    return None


# --- Redis behind Sentinel: redis+sentinel://[[user]:password@]host[:26379][,...]/<service>[/db] ---
# The user and password are the primary's (?sentinel_password= the Sentinels'); rediss+sentinel://
# speaks TLS to both. Parsed here, once; jobs.core.store.connection builds the client.

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SENTINEL_PORT = 26379
SENTINEL_EXAMPLE = "redis+sentinel://sentinel-1:26379,sentinel-2:26379/mymaster/0"
#: Query options the URL may carry; anything else is a mistake worth naming.
SENTINEL_OPTIONS = ("sentinel_password", "ssl_cert_reqs", "ssl_ca_certs")


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    options: dict[str, str] = field(default_factory=dict)


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The parts of a Sentinel URL; a ValueError saying what is wrong (never repeating the URL,
    which may carry a password)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in SENTINEL_SCHEMES:
        raise ValueError(f"must start with {' or '.join(s + '://' for s in SENTINEL_SCHEMES)}")
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
        if name not in SENTINEL_OPTIONS:
            raise ValueError(f"has an option Sentinel URLs do not take ({name}); "
                             f"they take {', '.join(SENTINEL_OPTIONS)}")
        options[name] = values[-1]
    return SentinelUrl(sentinels, path[0], db, unquote(username) or None, unquote(password) or None,
                       tls=parts.scheme.lower() == "rediss+sentinel", options=options)


def _host_port(text: str) -> tuple[str, int]:
    text = text.strip()
    if text.startswith("["):  # [::1]:26379
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") or str(SENTINEL_PORT)
    else:
        host, colon, port = text.rpartition(":")
        if not colon:
            host, port = text, str(SENTINEL_PORT)
    if not host:
        raise ValueError("has an empty Sentinel address: list them as host:port,host:port")
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError("has a Sentinel port that is not a number from 1 to 65535")
    return host, int(port)


def _sentinel_url_problem(url: str) -> str | None:
    """Why ``url`` is not a usable Sentinel URL, or None."""
    try:
        parse_sentinel_url(url)
    except ValueError as exc:
        return f"is not a Sentinel URL: it {exc}; write it like {SENTINEL_EXAMPLE}"
    return None
