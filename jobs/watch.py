"""Following a job from a terminal, polling with backoff: every 1 s for the first 10 s,
then every 5 s. A hundred idle watchers must not become a hundred requests a second."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

TERMINAL = ("succeeded", "failed")


#: The backoff schedule, shared with the web page's poller (web/static/job.js reads it
#: from the page): every FAST_POLL seconds during the first FAST_PERIOD, then every SLOW_POLL.
FAST_POLL = 1.0
FAST_PERIOD = 10.0
SLOW_POLL = 5.0


def poll_delay(elapsed: float) -> float:
    """Seconds to wait before the next poll, given seconds since watching began."""
    return FAST_POLL if elapsed < FAST_PERIOD else SLOW_POLL


def render(fields: dict, width: int = 30) -> str:
    total, done = fields["total"] or 0, fields["done"] or 0
    filled = int(width * done / total) if total else 0
    bar = "#" * filled + "-" * (width - filled)
    stale = "  STALE: worker stopped reporting, will be retried" if fields.get("stale") else ""
    return f"[{bar}] {done}/{total} {fields['state']} (attempt {fields['attempts']}/{fields['max_attempts']}){stale}"


def watch_job(fetch: Callable[[], dict], first: dict | None = None, out: TextIO | None = None,
              sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> dict:
    started = clock()
    fields = first or fetch()
    while True:
        if out is not None:
            out.write("\r" + render(fields))
            out.flush()
        if fields["state"] in TERMINAL:
            if out is not None:
                out.write("\n")
            return fields
        sleep(poll_delay(clock() - started))
        fields = fetch()
