"""The counters of failed guesses of a secret (a sign-in token, a bearer token, the dashboard's
password), kept in the job store's Redis by the ``limits`` package in a moving window, shared by
every web process. What counts as a failure and what a refusal answers is web/guessing.py's."""

from __future__ import annotations

from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter
from redis import Redis

from jobs import keys


def limiter(connection: Redis) -> MovingWindowRateLimiter:
    """The failures' limiter on ``connection``'s Redis (its pool: same TLS and timeout options)."""
    storage = RedisStorage("redis://", connection_pool=connection.connection_pool, key_prefix=keys.GUESS_RATE_PREFIX)
    return MovingWindowRateLimiter(storage)


def scopes(door: str, address: str, guess_digest: str) -> list[tuple[str, ...]]:
    """The two counters one failure at ``door`` counts in: its client address's and its guess's."""
    return [keys.guess_rate_scope(door, "address", address), keys.guess_rate_scope(door, "guess", guess_digest)]
