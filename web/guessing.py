"""Guessing secrets is slow: failed sign-ins, unknown bearer tokens (the API, /metrics) and
wrong dashboard passwords are counted per client address and per failing guess (the whole
secret presented, with the user name for the dashboard; kept as a keyed digest), in a moving
window (``LEASH_GUESS_RATE``, the ``limits`` package on the job store's Redis, as
LEASH_SUBMIT_RATE).

Over it, every attempt from that address is a 429 with ``Retry-After`` — the right secret too,
so a guesser learns nothing while refused — and so is that same wrong guess from anywhere; one
WARNING line says so per burst (the failure that crossed the limit). Nothing is counted by user
name or token prefix alone: the right secret has never failed, so guessers elsewhere cannot
lock its owner out. Only failures count: a signed-in browser or a
client with a good token is never slowed by its own use, and costs no Redis call: the failures
are counted in Redis (shared by every process), the refusals they lead to are remembered in
the process until their window frees (another process learns of one at its next failure).

The client address is the connection's peer, or the address a trusted proxy forwarded
(``LEASH_TRUSTED_PROXIES``: waitress puts it in REMOTE_ADDR; web/serve.py).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import time

from flask import current_app, request
from limits import parse_many
from limits.strategies import MovingWindowRateLimiter
from werkzeug.exceptions import TooManyRequests

from jobs.intake import guesses

from . import app_settings

log = logging.getLogger(__name__)

class GuessingRefused(TooManyRequests):
    def __init__(self, description: str, retry_after: int):
        super().__init__(description)
        self.retry_after = retry_after

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("Retry-After", str(self.retry_after))]


def _limiter() -> tuple[MovingWindowRateLimiter, dict]:
    """The shared counter of failures, and the refusals this process remembers."""
    extensions = current_app.extensions
    if "leash_guessing" not in extensions:
        extensions["leash_guessing"] = (guesses.limiter(extensions["leash_redis"]), {})
    return extensions["leash_guessing"]


#: Refusals remembered at most (the oldest are forgotten first past it).
MAX_REMEMBERED = 10_000


def _scopes(door: str, guessed: str) -> list[tuple[str, ...]]:
    # Keyed by the app's secret: the digest of a near-miss stored in Redis tells a reader nothing.
    key = app_settings.current().secret.encode()
    guess = hmac.new(key, guessed.encode(errors="replace"), hashlib.sha256).hexdigest()[:24]
    return guesses.scopes(door, request.remote_addr or "unknown", guess)


def _refusal(door: str, what: str, wait: int) -> GuessingRefused:
    return GuessingRefused(f"too many failed {what} from this address or with this {door} secret; try again in "
                           f"{wait} s (LEASH_GUESS_RATE)", wait)


def check(door: str, guessed: str, what: str) -> None:
    """Raise a 429 while this address, or this guess's family, is refused."""
    _, refused = _limiter()
    now = time.monotonic()
    for scope in _scopes(door, guessed):
        until = refused.get(scope)
        if until is not None:
            if until > now:
                raise _refusal(door, what, max(1, math.ceil(until - now)))
            refused.pop(scope, None)


def failed(door: str, guessed: str, what: str) -> None:
    """Count a failure; the one that finds the limit reached is logged (once per burst) and refused."""
    limiter, refused = _limiter()
    for scope in _scopes(door, guessed):
        for rate in parse_many(app_settings.current().web.guess_rate):
            if not limiter.hit(rate, *scope):
                reset = limiter.get_window_stats(rate, *scope).reset_time
                wait = max(1, math.ceil(reset - time.time()))
                if len(refused) >= MAX_REMEMBERED:
                    refused.pop(next(iter(refused)))
                refused[scope] = time.monotonic() + wait
                log.warning("refusing %s from %s for %d s: more than %s failed (LEASH_GUESS_RATE, by %s)",
                            what, request.remote_addr, wait, rate, scope[-2])
                raise _refusal(door, what, wait)
