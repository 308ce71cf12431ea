"""Which Redis a ``leash`` command talks to, and what it says when that Redis is wrong.

``REDIS_URL`` if set; else the Redis of a running ``leash dev`` (cli/devrecord.py; said once
per terminal session, so nobody wonders which Redis answered); else one line saying there is
none: a Redis that happens to answer on 6379 is never written to unasked. A URL
that is not a Redis URL is one line and exit status 2; an unreachable Redis is one line
that names the URL tried, and exit status 3 (cli/exit_codes.py).
"""

from __future__ import annotations

import click
import redis

from jobs.config import redis_settings
from jobs.config.front import command_line
from jobs.core.store.connection import configured_url, connect, masked
from jobs.core.store.redis_url import redis_url_problem

from . import devrecord
from .exit_codes import BAD_INPUT, NoRedisError

EXAMPLE_URL = "redis://localhost:6379/0"


class BadRedisUrl(click.ClickException):
    exit_code = BAD_INPUT


class NoRedis(NoRedisError):
    """Neither REDIS_URL nor a running ``leash dev``: no Redis is guessed (exit NO_REDIS)."""


def shown(url: str) -> str:
    """The URL with its password masked, for messages (jobs.core.store.connection.masked)."""
    return masked(url)


def check_url(url: str, origin: str) -> None:
    """Raise ``BadRedisUrl`` (exit 2) unless ``url`` is a URL redis-py can use."""
    problem = redis_url_problem(url)
    if problem:
        raise BadRedisUrl(f"{origin} {shown(url)!r} {problem}")


def chosen_dev() -> dict | None:
    """The running ``leash dev`` the commands talk to: the one whose web address is
    LEASH_WEB_URL, else the one whose Redis is REDIS_URL, else the newest."""
    devs = devrecord.running()
    wanted_web = (command_line().web_url or "").rstrip("/")
    wanted_redis = configured_url()
    for dev in devs:
        if (wanted_web and dev.get("web_url") == wanted_web) or (wanted_redis and dev.get("redis_url") == wanted_redis):
            return dev
    return devs[0] if devs else None


def resolve() -> tuple[str, str]:
    """(the URL, where it came from). Without REDIS_URL, a running ``leash dev``'s Redis (said
    once per terminal session); without either, ``NoRedis``: a Redis that merely happens to
    answer on 6379 is never used unasked."""
    if configured_url():
        return configured_url(), "REDIS_URL"
    dev = chosen_dev()
    if dev is None:
        raise NoRedis("no Redis: no `leash dev` is running and REDIS_URL is not set; "
                      "start `leash dev` in another terminal, or set REDIS_URL")
    url = str(dev.get("redis_url"))
    others = len(devrecord.running()) - 1
    also = f"; {others} other leash dev running, LEASH_WEB_URL picks one" if others > 0 else ""
    devrecord.notice_once(f"leash: using `leash dev` at {dev.get('web_url')} (Redis {shown(url)}{also})")
    return url, f"the Redis of `leash dev` at {dev.get('web_url')}"


def web_url() -> str:
    """Where the web app answers, for printing a job's address: ``LEASH_WEB_URL``, else the
    running ``leash dev``'s (the one using REDIS_URL, when it is set), else ``leash dev``'s
    default."""
    dev = chosen_dev()
    if configured_url() and (dev or {}).get("redis_url") != configured_url():
        dev = None  # a Redis of its own: a local leash dev's pages do not show its jobs
    configured = command_line().web_url or (dev or {}).get("web_url") or "http://127.0.0.1:5000"
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
        conn = connect(url) if for_worker else connect(url, socket_timeout=redis_settings().redis_timeout)
        conn.ping()
    except ValueError as exc:
        raise BadRedisUrl(f"{shown(url)!r} is not a Redis URL ({exc}); write it like {EXAMPLE_URL}") from None
    except redis.exceptions.RedisError as exc:
        hint = "is `leash dev` still running? " if origin != "REDIS_URL" else ""
        raise NoRedisError(f"cannot reach Redis at {shown(url)} ({exc}); {hint}set REDIS_URL") from None
    conn.leash_url = shown(url)  # type: ignore[attr-defined]  # for errors later in the command
    conn.leash_archive_url = dev_archive_url()  # type: ignore[attr-defined]  # its workers' archive, when none is set
    return conn


def dev_archive_url() -> str | None:
    """The archive of the ``leash dev`` whose Redis the commands use (its workers keep ended jobs
    and the request cache's older answers there), or None: no such ``leash dev``, or REDIS_URL
    names another Redis. Readers use it only when no archive is configured."""
    dev = chosen_dev()
    if dev is None or (configured_url() and dev.get("redis_url") != configured_url()):
        return None
    return devrecord.dev_archive_url(dev)
