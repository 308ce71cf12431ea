"""Which Redis a ``leash`` command talks to, and what it says when that Redis is wrong.

``REDIS_URL`` if set; else the URL that a running ``leash dev`` recorded (said once on
stderr, so nobody wonders which Redis answered); else ``redis://127.0.0.1:6379/0``. A URL
that is not a Redis URL is one line and exit status 2; an unreachable Redis is one line
that names the URL tried.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

import click
import redis

from jobs import config
from jobs.connection import DEFAULT_URL, connect, masked

EXAMPLE_URL = "redis://localhost:6379/0"
#: Where ``leash dev`` writes the addresses it uses, for the other commands to find.
RECORD_NAME = "dev.json"


class BadRedisUrl(click.ClickException):
    exit_code = 2


def record_path() -> Path:
    """``$XDG_STATE_HOME/leash/dev.json`` (``~/.local/state/leash/dev.json`` by default)."""
    state_home = config.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state_home) / "leash" / RECORD_NAME


def read_record() -> dict:
    try:
        record = json.loads(record_path().read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def write_record(redis_url: str, web_url: str, pid: int) -> Path:
    """Write the record for this user's eyes only (a REDIS_URL can carry a password): into a new
    file of a random name, created with O_EXCL | O_NOFOLLOW at mode 0600 (never a file or a
    symlink someone placed there beforehand), then renamed over the record, which replaces a
    symlink in its place rather than following it; readers never see half a file."""
    path = record_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = json.dumps({"redis_url": redis_url, "web_url": web_url, "pid": pid}).encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o600)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def remove_record(pid: int) -> None:
    """Forget the record if it is still ours (a second ``leash dev`` may have replaced it)."""
    if read_record().get("pid") == pid:
        record_path().unlink(missing_ok=True)


def shown(url: str) -> str:
    """The URL with its password masked, for messages (jobs.connection.masked)."""
    return masked(url)


def check_url(url: str, origin: str) -> None:
    """Raise ``BadRedisUrl`` (exit 2) unless ``url`` is a URL redis-py can use."""
    example = EXAMPLE_URL
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is what raises for "host:abc"
    except ValueError as exc:
        raise BadRedisUrl(f"{origin} {shown(url)!r} is not a Redis URL ({exc}); write it like {example}") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise BadRedisUrl(f"{origin} {shown(url)!r} is not a Redis URL: it must start with redis://, rediss:// "
                          f"or unix://, e.g. {example}")


_said: set[str] = set()


def resolve() -> tuple[str, str]:
    """(the URL, where it came from) — says so on stderr, once, when it came from the record."""
    if config.get("REDIS_URL"):
        return config.get("REDIS_URL"), "REDIS_URL"
    recorded = read_record().get("redis_url")
    if isinstance(recorded, str) and recorded:
        if recorded not in _said:
            _said.add(recorded)
            click.echo(f"leash: using the Redis of `leash dev`, {shown(recorded)} "
                       f"(recorded in {record_path()}; set REDIS_URL to choose another)", err=True)
        return recorded, f"the URL recorded by `leash dev` in {record_path()}"
    return DEFAULT_URL, "the default Redis URL"


def web_url() -> str:
    """Where the web app answers, for printing a job's address: ``LEASH_WEB_URL``, else the
    one ``leash dev`` recorded, else ``leash dev``'s default."""
    configured = config.get("LEASH_WEB_URL") or read_record().get("web_url") or "http://127.0.0.1:5000"
    return str(configured).rstrip("/")


def connect_checked(for_worker: bool = False) -> redis.Redis:
    """A connection for the command line, pinged once: a bad or unreachable Redis is one
    line naming the URL instead of a traceback later. A command's calls give up after
    LEASH_REDIS_TIMEOUT, so a Redis that accepts connections but does not answer (stalled,
    partitioned) is an error instead of a command that hangs; a worker's connection gets
    RQ's own socket timeout instead, long enough for its blocking dequeue."""
    url, origin = resolve()
    check_url(url, "REDIS_URL" if origin == "REDIS_URL" else origin)
    try:
        conn = connect(url) if for_worker else connect(url, socket_timeout=config.get("LEASH_REDIS_TIMEOUT"))
        conn.ping()
    except ValueError as exc:
        raise BadRedisUrl(f"{shown(url)!r} is not a Redis URL ({exc}); write it like {EXAMPLE_URL}") from None
    except redis.exceptions.RedisError as exc:
        hint = "is `leash dev` still running? " if origin != "REDIS_URL" and origin != "the default Redis URL" else ""
        raise click.ClickException(f"cannot reach Redis at {shown(url)} ({exc}); {hint}set REDIS_URL") from None
    conn.leash_url = shown(url)  # type: ignore[attr-defined]  # for errors later in the command
    return conn
