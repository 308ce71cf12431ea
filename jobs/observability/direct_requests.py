"""A request that reached the web app without the platform router's X-Forwarded-For while
LEASH_TRUSTED_PROXIES=* (web/proxy_check.py notes one), kept a week for ``leash doctor`` to warn
about: the app is reachable other than through the router, and there a client names its own
address. One note, the latest, shared by every web process."""

from __future__ import annotations

from redis import Redis

from jobs import keys

#: How long doctor keeps warning after the last note.
KEEP = 7 * 24 * 3600


def note(connection: Redis, at: float, peer: str, path: str) -> None:
    """The latest such request (one round trip)."""
    with connection.pipeline(transaction=False) as pipe:
        pipe.hset(keys.DIRECT_REQUEST, mapping={"at": at, "peer": peer, "path": path[:200]})
        pipe.expire(keys.DIRECT_REQUEST, KEEP)
        pipe.execute()


def latest(connection: Redis) -> dict[str, str]:
    """The latest note (``at``, ``peer``, ``path``); empty when none was kept."""
    return {k.decode(): v.decode() for k, v in connection.hgetall(keys.DIRECT_REQUEST).items()}
