"""Outcome counters, written by the fenced Lua transitions as jobs end (never by scanning
jobs): per minute (kept two days) for rate alerts, and all-time totals for /metrics."""

from __future__ import annotations

from redis import Redis

from jobs import keys
from jobs.core import clock


def window_counts(connection: Redis, seconds: int, kind: str | None = None,
                  now: float | None = None) -> dict[str, int]:
    """Succeeded, failed and canceled counts over the last ``seconds`` (whole minutes, this one
    included), for one kind or all kinds."""
    now = clock.wall() if now is None else now
    last = int(now // 60)
    minutes = range(last - max(1, -(-seconds // 60)) + 1, last + 1)
    label = kind or "_all"
    counts = {}
    for outcome in ("succeeded", "failed", "canceled"):
        values = connection.mget([keys.stats_minute(outcome, label, m) for m in minutes])
        counts[outcome] = sum(int(v) for v in values if v is not None)
    return counts


def totals(connection: Redis) -> dict[tuple[str, str], int]:
    """All-time counts by (outcome, kind)."""
    out = {}
    for field, value in connection.hgetall(keys.STATS_TOTALS).items():
        outcome, _, kind = field.decode().partition(":")
        out[(outcome, kind)] = int(value)
    return out
