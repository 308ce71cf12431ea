"""May this owner submit a job now? The one check at the door, for the API, the form and
``leash submit`` alike (``jobs.intake.submission.submit`` calls ``check`` before it writes).

    LEASH_MAX_QUEUED_PER_OWNER   an owner's jobs waiting to run (default 1000)
    LEASH_OWNER_DAILY_TOKENS/_USD  what an owner's jobs may use per UTC day (jobs/usage/budget.py)
    LEASH_SUBMIT_RATE            an owner's submissions per period (``60/minute``; unset: none)
    LEASH_DRY_RUN_RATE           dry runs and the form's Estimate, per owner and per client address
                                 (``check_dry_run``: an estimate checks the whole payload, as dear
                                 as a submission's check, and writes nothing to be capped)

A refusal is a ``Refusal(status, message, retry_after)``: the web app answers it with that
status and a ``Retry-After`` header, ``leash submit`` prints the message and exits 1.

Limits apply at the door only: nothing here is consulted once a job is accepted, so a job
accepted under yesterday's limits is never failed by today's. The queued count read here is an
early refusal only; the place itself is checked and taken in one step by ``jobs.enqueue``
(``jobs/intake/door.py``), so submissions racing each other never pass the cap, and a replay
counts against it the same way.

The rate is kept by the ``limits`` package (the engine and Redis storage flask-limiter is
built on) in the job store's own Redis, on a moving window: at most N submissions in any
period. It is used directly rather than through flask-limiter's decorators because
``leash submit`` writes to Redis without going through the web app, and both must spend one
counter.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

from limits import parse_many
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter
from redis import Redis

from jobs import keys
from jobs.config import quotas
from jobs.intake import door
from jobs.usage import prices
from jobs.usage.budget import owner_daily_limits, owner_over_daily, seconds_to_next_utc_day
from jobs.usage.meter import utc_day
from jobs.usage.prices import money

QUEUED_RETRY_AFTER = door.QUEUED_RETRY_AFTER


class Refusal(NamedTuple):
    """Why a submission is refused: the HTTP status, a message saying what to do, and the
    seconds to wait before trying again (``Retry-After``)."""

    status: int
    message: str
    retry_after: int


_limiters: dict[int, tuple[Redis, MovingWindowRateLimiter]] = {}


def _limiter(connection: Redis) -> MovingWindowRateLimiter:
    cached = _limiters.get(id(connection))
    if cached is None or cached[0] is not connection:
        # The storage shares the connection's pool: same Redis, same TLS and timeout options.
        storage = RedisStorage("redis://", connection_pool=connection.connection_pool,
                               key_prefix=keys.SUBMIT_RATE_PREFIX)
        cached = _limiters[id(connection)] = (connection, MovingWindowRateLimiter(storage))
    return cached[1]


def check(connection: Redis, owner: str) -> Refusal | None:
    """None when ``owner`` may submit a job now (and counts the submission against its rate),
    else why not. A repeat of an idempotency key the owner already used never comes here
    (``jobs.intake.submission`` answers it with the first job first: it writes nothing)."""
    cap = door.cap()
    queued = door.count(connection, owner)
    if queued >= cap:  # early, before the rate counts this one; jobs.enqueue takes the place exactly
        return Refusal(429, door.too_many_queued(owner, queued, cap), QUEUED_RETRY_AFTER)
    spent = owner_over_daily(connection, owner)
    if spent:  # the owner's daily budget (LEASH_OWNER_DAILY_TOKENS / _USD) is used up until UTC midnight
        return Refusal(429, f"{spent}; it starts again at 00:00 UTC", seconds_to_next_utc_day())
    rate = quotas.admission().submit_rate
    wait, item = hit(connection, rate, [keys.rate_scope("submit", owner)])
    if wait:
        return Refusal(429, f"too many submissions: at most {item} per owner (LEASH_SUBMIT_RATE); "
                            f"try again in {wait} s", wait)
    return None


def check_dry_run(connection: Redis, owner: str, address: str | None) -> Refusal | None:
    """None when ``owner``, from ``address`` (None: not a web request), may ask for an estimate
    now (and counts it), else why not. Counted before the payload is checked: a refused ask
    costs no check."""
    scopes = [keys.rate_scope("dry-run", "owner", owner)]
    if address:
        scopes.append(keys.rate_scope("dry-run", "address", address))
    wait, item = hit(connection, quotas.admission().dry_run_rate, scopes)
    if wait:
        return Refusal(429, f"too many dry runs and estimates: at most {item} per owner and per address "
                            f"(LEASH_DRY_RUN_RATE); try again in {wait} s", wait)
    return None


def hit(connection: Redis, rate: str | None, scopes: list[tuple[str, ...]]) -> tuple[int, object]:
    """(0, None) when every scope (``keys.rate_scope``) has room under ``rate`` (each counted),
    else (seconds to wait, the rate item that refused)."""
    if not rate:
        return 0, None
    limiter = _limiter(connection)
    for scope in scopes:
        for item in parse_many(rate):
            if not limiter.hit(item, *scope):
                reset_at = limiter.get_window_stats(item, *scope).reset_time
                return max(1, math.ceil(reset_at - time.time())), item
    return 0, None


def owner_day_room(connection: Redis, owner: str, price: dict | None) -> Refusal | None:
    """Why a job priced ``price`` (jobs.intake.estimate) cannot make even one call within what
    ``owner``'s UTC day has left (LEASH_OWNER_DAILY_TOKENS / _USD): its cheapest call
    (``one_call_tokens_min``, ``one_call_usd_min``) does not fit what the day has not used --
    accepted, it would fail at its first call. None when it fits, the day has no limit, or the
    job makes no call (every request cached, no model configured here)."""
    limit_tokens, limit_nusd = owner_daily_limits()
    if (not limit_tokens and not limit_nusd) or not price or not price.get("one_call_tokens_min"):
        return None
    day = utc_day()
    used_in, used_out, used_nusd = connection.hmget(keys.usage_owner_day(owner, day), "input_tokens",
                                                    "output_tokens", "cost_nusd")
    needed = int(price["one_call_tokens_min"])
    left = limit_tokens - int(used_in or 0) - int(used_out or 0)
    if limit_tokens and left < needed:
        why = (f"budget reached: owner {owner!r} has {max(0, left):,} tokens left of its daily budget of "
               f"{limit_tokens:,} today (UTC {day}, LEASH_OWNER_DAILY_TOKENS), fewer than one call of this job "
               f"needs ({needed:,})")
        return Refusal(429, f"{why}; it starts again at 00:00 UTC", seconds_to_next_utc_day())
    needed_usd = price.get("one_call_usd_min")
    left_nusd = limit_nusd - int(used_nusd or 0)
    if limit_nusd and needed_usd is not None and left_nusd < prices.nano(needed_usd):
        why = (f"budget reached: owner {owner!r} has {money(prices.usd(max(0, left_nusd)))} left of its daily budget "
               f"of {money(prices.usd(limit_nusd))} today (UTC {day}, LEASH_OWNER_DAILY_USD), less than one call of "
               f"this job costs ({money(needed_usd)})")
        return Refusal(429, f"{why}; it starts again at 00:00 UTC", seconds_to_next_utc_day())
    return None
