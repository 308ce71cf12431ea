"""Taking a job off several queues without a window in which a crash loses it.

RQ moves a job into a per-queue intermediate list as it dequeues (BLMOVE) only when a worker
serves ONE queue; with several it uses BLPOP, and a worker killed right after that BLPOP
takes the queue entry with it, leaving the job "queued" forever. ``LeashQueue`` dequeues
from several queues the same way as from one: a non-blocking LMOVE from each queue in
priority order, then a short BLMOVE on the first, again and again until the timeout. A job
is therefore always either on its queue, in an intermediate list (where the reaper gives it
back if its worker died before claiming it), or claimed.

A queue an operator paused (``leash pause``, jobs/core/switches.py) is left out of every
dequeue; a worker whose every queue is paused waits, looking again every PAUSE_LOOK seconds.
"""

from __future__ import annotations

import time

from rq.exceptions import DequeueTimeout
from rq.queue import Queue

from jobs.core import switches

#: Longest a job on a lower-priority queue waits while the worker blocks on the first queue.
SCAN_EVERY = 1


#: How often a worker whose queues are all paused looks whether one was resumed (seconds).
PAUSE_LOOK = 0.5


class LeashQueue(Queue):
    @classmethod
    def dequeue_any(cls, queues, timeout, connection, **kwargs):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            paused = switches.paused(connection)
            ready = [queue for queue in queues if queue.name not in paused]
            if ready:
                return super().dequeue_any(ready, timeout, connection=connection, **kwargs)
            if deadline is None:
                return None  # burst: nothing to take
            left = deadline - time.monotonic()
            if left <= 0:
                raise DequeueTimeout(timeout, [queue.key for queue in queues])
            time.sleep(min(PAUSE_LOOK, left))

    @classmethod
    def lpop(cls, queue_keys, timeout, connection=None):
        if len(queue_keys) == 1:
            return super().lpop(queue_keys, timeout, connection=connection)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for key in queue_keys:
                found = cls.lmove(connection, key, None)
                if found is not None:
                    return found
            if deadline is None:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise DequeueTimeout(timeout, queue_keys)
            try:
                return cls.lmove(connection, queue_keys[0], max(1, min(SCAN_EVERY, int(left))))
            except DequeueTimeout:
                continue
