"""Clock helpers. Wall clock (unix seconds) is what leases and timestamps are stored in;
monotonic time is for local deadlines. Functions that decide on time take ``now=None``."""

import time


def wall() -> float:
    return time.time()


def monotonic() -> float:
    return time.monotonic()


def iso(ts: float | None) -> str | None:
    """Render a unix timestamp as ISO 8601 UTC, or None."""
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1000):03d}Z"
