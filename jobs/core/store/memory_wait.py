"""Redis full (``maxmemory`` with ``noeviction``): wait for memory and carry on.

A full Redis refuses writes ("OOM command not allowed") and still answers reads. Nothing a
worker, its work-horse or its retry scheduler does is wrong at such a time, only impossible
for a while, so each waits with backoff and tries again: an operator frees memory (shorter
retention, a bigger plan) and every job carries on where it was. One WARNING when the
waiting starts and one line when it ends, never one per retry: a full Redis must not also
fill the logs.
"""

from __future__ import annotations

import logging
import time

from jobs.core import clock

#: Backoff between tries: from FIRST_DELAY doubling to MAX_DELAY seconds.
FIRST_DELAY = 0.25
MAX_DELAY = 5.0

FIX = "free memory (a shorter LEASH_RESULT_TTL, a larger maxmemory) and it carries on by itself"


class MemoryWait:
    """The waiting of one process (worker, work-horse or scheduler)."""

    def __init__(self, log: logging.Logger, who: str):
        self.log = log
        self.who = who
        self.since: float | None = None
        self.delay = FIRST_DELAY

    @property
    def waiting(self) -> bool:
        return self.since is not None

    def refused(self, exc: BaseException) -> float:
        """A write was refused for memory: log it if this starts a wait; returns how long to
        wait before the next try (the backoff)."""
        if self.since is None:
            self.since = clock.monotonic()
            self.log.warning("Redis is full and refuses writes (%s); %s waits and retries with backoff: %s",
                             str(exc).strip()[:120], self.who, FIX)
        delay, self.delay = self.delay, min(self.delay * 2, MAX_DELAY)
        return delay

    def accepted(self) -> None:
        """A write landed: if a wait was on, it has ended."""
        if self.since is not None:
            self.log.warning("Redis accepts writes again after %.0f s; %s carries on",
                             clock.monotonic() - self.since, self.who)
            self.since, self.delay = None, FIRST_DELAY

    def sleep(self, exc: BaseException) -> None:
        time.sleep(self.refused(exc))
