"""What a job kind's function gets: the payload, progress, checkpoints, and ``once``.

Every call here is a heartbeat: it renews the lease and records progress in one atomic
write. It is also where an attempt learns it must stop — a cancel (``Canceled``), a deploy
(``HandOff``, after the checkpoint is safe) or a lost lease (``LeaseLost``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from . import effects, keys
from .errors import Canceled, HandOff
from .lease import Attempt


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
