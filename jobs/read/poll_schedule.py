"""The polling schedule for following a job, shared by ``leash watch`` and the web page's
poller: every 1 s for the first 10 s, then every 5 s. A hundred idle watchers must not become
a hundred requests a second."""

from __future__ import annotations

#: The backoff schedule, shared with the web page's poller (web/static/job.js reads it
#: from the page): every FAST_POLL seconds during the first FAST_PERIOD, then every SLOW_POLL.
FAST_POLL = 1.0
FAST_PERIOD = 10.0
SLOW_POLL = 5.0


def poll_delay(elapsed: float) -> float:
    """Seconds to wait before the next poll, given seconds since watching began."""
    return FAST_POLL if elapsed < FAST_PERIOD else SLOW_POLL
