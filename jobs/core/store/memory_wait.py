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

#: What this process knows of Redis refusing writes for memory (unix seconds): the last refusal
#: it met or learnt of, when those refusals began (a gap of EPISODE_GAP starts anew), and when
#: its writes were first taken again after them. The reaper of a worker reads them to give the
#: leases that ran out meanwhile time to be renewed (jobs/core/upkeep/reaper.py).
last_refused_at: float | None = None
refused_since: float | None = None
writes_back_at: float | None = None
EPISODE_GAP = 4 * MAX_DELAY

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
        note_refused()
        if self.since is None:
            self.since = clock.monotonic()
            self.log.warning("Redis is full and refuses writes (%s); %s waits and retries with backoff: %s",
                             str(exc).strip()[:120], self.who, FIX)
        delay, self.delay = self.delay, min(self.delay * 2, MAX_DELAY)
        return delay

    def accepted(self) -> None:
        """A write landed: if a wait was on, it has ended."""
        if self.since is not None:
            note_writes_back()
            self.log.warning("Redis accepts writes again after %.0f s; %s carries on",
                             clock.monotonic() - self.since, self.who)
            self.since, self.delay = None, FIRST_DELAY

    def sleep(self, exc: BaseException) -> None:
        time.sleep(self.refused(exc))


def note_refused(now: float | None = None, since: float | None = None) -> None:
    """Remember that Redis refused writes for memory: just now, or (``since`` given, learnt from
    Redis's own count of refusals) at some moment between ``since`` and ``now``."""
    global last_refused_at, refused_since, writes_back_at
    now = clock.wall() if now is None else now
    start = now if since is None else since
    if last_refused_at is None or refused_since is None or start - last_refused_at > EPISODE_GAP:
        refused_since = start
    else:
        refused_since = min(refused_since, start)
    last_refused_at = max(now, last_refused_at or now)
    writes_back_at = None


def note_writes_back(now: float | None = None) -> None:
    """A write of this process landed: if refusals came before it, they have ended now."""
    global writes_back_at
    if last_refused_at is not None and writes_back_at is None:
        writes_back_at = clock.wall() if now is None else now


def lease_grace(lease_seconds: float, now: float | None = None) -> tuple[float, float] | None:
    """After refusals for memory: (since, until). A lease that ran out at or after ``since``
    could not be renewed while Redis refused writes; its work-horse gets until ``until`` (one
    lease, plus its longest backoff, after writes were taken again) to write what it holds and
    renew it. None when this process met no refusal lately."""
    if last_refused_at is None or refused_since is None:
        return None
    now = clock.wall() if now is None else now
    back = writes_back_at if writes_back_at is not None else now
    until = max(back, last_refused_at) + lease_seconds + MAX_DELAY
    return (refused_since, until) if now < until else None
