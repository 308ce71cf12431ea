"""Adaptive concurrency per model, shared by every worker: how many calls each job may have in
flight to one model right now.

The limit lives in Redis (``jobs/lua/model_concurrency_v1.lua``): a 429 or a timeout from any
job halves it for every job calling that model; after a window of clean answers it grows back
by one, up to ``LEASH_ITEM_CONCURRENCY`` (AIMD). Each job learns the current limit from the
reply to every answer it reports, so a halving reaches every job within one call.

``ConcurrencyGate`` applies the limit inside one attempt: a call takes a slot before it is
sent and gives it back, with its outcome, when the answer arrives.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import NamedTuple

import redis
from redis import Redis

from jobs import keys
from jobs.core.running.items import NotStarted
from jobs.lifecycle import scripts

log = logging.getLogger("leash.items")

#: Windows of ``limit`` clean answers before the limit steps back up to the level of the last overload.
PROBE_ROUNDS = 40
#: A model's limit is forgotten a day after its last call.
KEEP_SECONDS = 24 * 3600
#: How often a waiting call looks again for a slot or a stopping item run (seconds).
POLL_SECONDS = 0.1

OK, RATE_LIMITED, TIMED_OUT = "ok", "429", "timeout"


class Reading(NamedTuple):
    limit: int
    epoch: int  # bumped by each halving; an overload reported with an older one is not counted
    version: int  # bumped by each change of the limit


class SharedLimit:
    """The per-model limit in Redis."""

    def __init__(self, connection: Redis, model: str, ceiling: int):
        self.connection = connection
        self.model = model
        self.ceiling = ceiling
        self.keys = {"model_limit": keys.model_concurrency(model), "models": keys.MODELS}

    def _run(self, op: str, epoch: int = 0, reason: str = "") -> Reading:
        limit, epoch, version = scripts.run(
            self.connection, "model_concurrency_v1", keys=self.keys,
            args=[op, self.ceiling, self.model, epoch, reason, PROBE_ROUNDS, KEEP_SECONDS])
        return Reading(int(limit), int(epoch), int(version))

    def read(self) -> Reading:
        return self._run("read")

    def answered(self) -> Reading:
        return self._run("ok")

    def overloaded(self, epoch: int, reason: str) -> Reading:
        return self._run("overload", epoch=epoch, reason=reason)


class ConcurrencyGate:
    """Calls of one attempt to one model: at most the shared limit in flight at once."""

    def __init__(self, shared: SharedLimit, job_id: str = ""):
        self.shared = shared
        self.job_id = job_id
        self.reading = shared.read()
        self.in_flight = 0
        self._changed = threading.Condition()

    def width(self) -> int:
        return max(1, min(self.reading.limit, self.shared.ceiling))

    def acquire(self, stopping: threading.Event | None = None) -> int:
        """Wait for a slot; returns the epoch to report the outcome with. Raises NotStarted
        if the item run stops while this call waits."""
        with self._changed:
            while self.in_flight >= self.width():
                if stopping is not None and stopping.is_set():
                    raise NotStarted()
                self._changed.wait(POLL_SECONDS)
            self.in_flight += 1
            return self.reading.epoch

    def release(self, epoch: int, outcome: str | None) -> None:
        """Give the slot back. ``outcome``: OK, RATE_LIMITED or TIMED_OUT is reported to the
        shared limit; None (a call that never reached the model, or another error) is not."""
        try:
            if outcome == OK:
                self._learn(self.shared.answered(), cause="")
            elif outcome in (RATE_LIMITED, TIMED_OUT):
                self._learn(self.shared.overloaded(epoch, outcome), cause=outcome)
        except redis.exceptions.RedisError as exc:
            # Best effort: the shared limit misses one report; the call's answer is kept.
            log.warning("model %s: could not report a call's outcome to the shared limit: %s", self.shared.model, exc)
        finally:
            with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()

    def _learn(self, reading: Reading, cause: str) -> None:
        with self._changed:
            if reading.version < self.reading.version:
                return  # another thread already learned something newer
            before = self.width()
            self.reading = reading
            after = self.width()
            self._changed.notify_all()
        if after != before:
            if after > before:
                why = "clean answers"
            else:
                why = f"this job's call: {cause}" if cause else "another call's 429 or timeout"
            log.info("job %s: model %s concurrency %d -> %d (%s)", self.job_id, self.shared.model, before, after, why)


@dataclass
class ModelConcurrency:
    """What /metrics reports for one model."""

    model: str
    limit: int
    answers: int
    rate_limited: int
    timed_out: int


def snapshot(connection: Redis) -> list[ModelConcurrency]:
    """Every model's current limit and counts, in two round trips."""
    models = sorted(m.decode() for m in connection.smembers(keys.MODELS))
    with connection.pipeline(transaction=False) as pipe:
        for model in models:
            pipe.hmget(keys.model_concurrency(model), "limit", "answers", "overloads_429", "overloads_timeout")
        rows = pipe.execute()
    return [ModelConcurrency(model, int(limit), int(answers or 0), int(r429 or 0), int(timeouts or 0))
            for model, (limit, answers, r429, timeouts) in zip(models, rows, strict=True) if limit is not None]
