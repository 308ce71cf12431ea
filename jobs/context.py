"""What a job kind's function gets: the payload, progress, checkpoints, and ``once``.

Every call here is a heartbeat: it renews the lease and records progress in one atomic
write. It is also where an attempt learns it must stop — a cancel (``Canceled``), a deploy
(``HandOff``, after the checkpoint is safe) or a lost lease (``LeaseLost``).

Waiting is not dying: ``sleep`` (a rate limit, a Retry-After) renews the lease as it waits,
and ``keepalive`` renews it from a thread while one slow call runs — up to that call's
timeout, so a hung call still loses its lease and gets reclaimed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from . import clock, effects, keys
from .errors import Canceled, HandOff, LeaseLost
from .lease import Attempt

log = logging.getLogger("leash.context")


class JobContext:
    def __init__(self, attempt: Attempt, payload: dict):
        self.attempt = attempt
        self.payload = payload
        self.connection = attempt.connection
        self.job_id = attempt.job_id

    def _after_heartbeat(self, cancel_requested: bool) -> None:
        if cancel_requested:
            raise Canceled()
        if self.attempt.handoff_requested:
            raise HandOff()

    def progress(self, done: int, total: int | None = None) -> None:
        """Report progress; renews the lease."""
        self._after_heartbeat(self.attempt.heartbeat(done=done, total=total))

    def checkpoint(self, index: int, value: Any) -> None:
        """Store one item's result and renew the lease, atomically; done = items stored."""
        item = (index, json.dumps(value))
        self._after_heartbeat(self.attempt.heartbeat(item=item))

    def items_done(self) -> dict[int, Any]:
        """Results already stored by earlier attempts (the resume point)."""
        raw = self.connection.hgetall(keys.items(self.job_id))
        return {int(k): json.loads(v) for k, v in raw.items()}

    def for_each(self, items: Iterable[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """Apply ``fn`` to each item not done yet, checkpointing each result; returns all
        results in order (earlier attempts' included)."""
        items = list(items)
        done = self.items_done()
        self.progress(len(done), total=len(items))
        for index, item in enumerate(items):
            if index in done:
                continue
            done[index] = fn(item)
            self.checkpoint(index, done[index])
        return [done[i] for i in range(len(items))]

    def once(self, name: str, effect: Callable[[], Any]) -> bool:
        """Run a side effect at most once per job (see jobs.effects). Checks the lease first,
        so an attempt that already lost the job does not get through."""
        self.progress(self.attempt.done)
        return effects.once(self.connection, self.job_id, name, effect)

    def renew(self) -> None:
        """Renew the lease without changing progress (a job that is waiting, not stuck)."""
        self.progress(self.attempt.done)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` and stay alive: the lease is renewed every third of its length,
        so a job waiting for a rate limit is never mistaken for a dead one."""
        deadline = clock.monotonic() + seconds
        step = self.attempt.lease_seconds / 3
        while (left := deadline - clock.monotonic()) > 0:
            time.sleep(min(step, left))
            self.renew()

    @contextmanager
    def keepalive(self, timeout: float) -> Iterator[None]:
        """Renew the lease from a background thread while one long call (a model request
        that outlasts the lease) runs in this one, for at most ``timeout`` seconds.

        After ``timeout`` the thread stops renewing: a call hung past its own timeout then
        lets the lease expire, and the reaper takes the job back. What the thread learns
        (lease lost, cancel requested) is raised here when the block ends; a thread has no
        caller to raise to.
        """
        stop = threading.Event()
        learned: list[BaseException] = []
        deadline = clock.monotonic() + timeout
        interval = self.attempt.lease_seconds / 3

        def renew_until_stopped() -> None:
            while not stop.wait(max(0.0, min(interval, deadline - clock.monotonic()))):
                if clock.monotonic() >= deadline:
                    log.warning("job %s: call still running after %.0fs; no longer renewing its lease",
                                self.job_id, timeout)
                    return
                try:
                    if self.attempt.heartbeat(done=self.attempt.done):
                        learned.append(Canceled())
                        return
                except LeaseLost as exc:
                    learned.append(exc)
                    return
                except Exception as exc:  # a Redis blip: the next round may get through
                    log.warning("job %s: keepalive heartbeat failed: %s", self.job_id, exc)

        thread = threading.Thread(target=renew_until_stopped, name=f"leash-keepalive-{self.job_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
        if learned:
            raise learned[0]
        # A hand-off waits for the next checkpoint, so the answer just received is kept.
