"""What a job kind's function gets: the payload, progress, checkpoints, and ``once``.

Every call here is a heartbeat: it renews the lease and records progress in one atomic
write. It is also where an attempt learns it must stop — a cancel (``Canceled``), a deploy
(``HandOff``, after the checkpoint is safe) or a lost lease (``LeaseLost``).

``for_each`` runs items several at once (``LEASH_ITEM_CONCURRENCY``; jobs.core.running.items explains what
stays true when they finish out of order).

Waiting is not dying: ``sleep`` (a rate limit, a Retry-After) renews the lease as it waits,
and ``keepalive`` renews it from a thread while slow calls run — each up to its own timeout,
so a hung call still loses its lease and gets reclaimed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from redis.exceptions import RedisError

from jobs import keys
from jobs.config import settings
from jobs.core import clock
from jobs.core.lease import Attempt
from jobs.core.running import effects
from jobs.core.running.items import CONCURRENCY_FIELD, ItemRun, NotStarted, Renewer, StopReason
from jobs.errors import Canceled, HandOff
from jobs.usage.meter import Meter, follow_ups_field, utc_day
from jobs.usage.meter import flush as flush_usage
from jobs.usage.meter import write_now as write_usage_now

log = logging.getLogger("leash.context")

#: Results stored again per write by restore_lost_items.
RESTORE_CHUNK = 500

class JobContext:
    def __init__(self, attempt: Attempt, payload: dict, model_factory: Callable[[JobContext], Any] | None = None,
                 batch_runner: Callable[..., list] | None = None):
        self.attempt = attempt
        self._model_factory = model_factory  # the runner's: the configured backend (jobs.models)
        self._batch_runner = batch_runner  # the runner's: jobs.batch.run.run
        self._model = None
        self.payload = payload
        self.connection = attempt.connection
        self.job_id = attempt.job_id
        self.meter = Meter(attempt.kind)  # model calls' usage, until the item write carries it
        self._stop: StopReason | None = None  # set while a for_each run is on
        self._renewer: Renewer | None = None
        # Every result this attempt stored (index -> JSON), to put back what Redis lost before
        # the job ends: see restore_lost_items.
        self._stored: dict[int, str] = {}
        self._stored_lock = threading.Lock()

    @property
    def model(self):
        """The configured model backend for this attempt (``classify``, ``complete``), built on
        first use: a kind that calls no model never loads one."""
        if self._model is None:
            if self._model_factory is None:
                raise RuntimeError("this context was made without a model backend")
            self._model = self._model_factory(self)
        return self._model

    def through_batch(self, spec, direct: Callable[[Any], Any]) -> list[Any]:
        """Batch mode (payload ``mode: "batch"``): the items through the provider's batch API as
        ``spec`` (the kind's ``BatchSpec``) says, ``direct`` for those it does not answer; all
        results in order, like ``for_each``. May park the job (``Parked``) until its next look."""
        if self._batch_runner is None:
            raise RuntimeError("this context was made without a batch runner")
        return self._batch_runner(self, self.model, spec, self.payload, direct)

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
        self.checkpoint_encoded(index, json.dumps(value))

    def checkpoint_encoded(self, index: int, encoded: str) -> None:
        # The usage of the calls that produced this item rides on the same write.
        usage = self.meter.take()
        try:
            if usage is not None and usage.prior[0]:
                # Some of its calls were written apart (Meter.settle): the item's own figures
                # are given whole, as a provider batch's items' are.
                cancel_requested = self.attempt.store_items([(index, encoded, usage.item_usage())], usage)
            else:
                cancel_requested = self.attempt.heartbeat(item=(index, encoded), usage=usage)
        except BaseException:
            if usage is not None:
                self.meter.keep(usage)  # paid for: the closing flush counts it (once, if this landed)
            raise
        self.stored([(index, encoded)])
        spilled = self.meter.take_spilled()  # rare: calls of another model or day, written apart
        if spilled:
            flush_usage(self.attempt, spilled)
        self._after_heartbeat(cancel_requested)

    def stored(self, entries: Iterable[tuple]) -> None:
        """Remember results this attempt's writes stored: ``(index, result JSON, ...)``."""
        with self._stored_lock:
            self._stored.update((entry[0], entry[1]) for entry in entries)

    def restore_lost_items(self) -> int:
        """Store again the results this attempt stored that Redis no longer holds, before the job
        ends. A failover to a replica loses the writes it had not yet received, yet the attempt
        may go on under the new primary (its claim had arrived, its lease not yet run out): it
        must not end ``succeeded`` without items it believes stored. Returns how many."""
        with self._stored_lock:
            stored = dict(self._stored)
        if not stored:
            return 0
        present = {int(i) for i in self.connection.hkeys(keys.items(self.job_id))}
        lost = sorted(set(stored) - present)
        if not lost:
            return 0
        log.warning("job %s: %d item result(s) this attempt stored are no longer in Redis (writes lost in a "
                    "failover?); storing them again", self.job_id, len(lost))
        for start in range(0, len(lost), RESTORE_CHUNK):
            self.attempt.store_items([(i, stored[i], "") for i in lost[start:start + RESTORE_CHUNK]], None)
        return len(lost)

    def settle_answered(self, model: str) -> None:
        """Before an item's next call (a repair, a correction): write the calls it has had
        answered (Meter.settle). Kept for the closing flush if Redis does not take them."""
        pending = self.meter.settle(model)
        if pending is None:
            return
        try:
            write_usage_now(self.attempt, pending)
        except BaseException:
            self.meter.keep(pending)
            raise
        try:  # how often this kind needs one: the price before the next run counts it (jobs.intake.estimate)
            self.connection.hincrby(keys.usage_owner_day(self.attempt.owner_name(), pending.day or utc_day()),
                                    follow_ups_field(model, self.attempt.kind), 1)
        except RedisError as exc:
            log.warning("job %s: could not count a repair or correction for the estimates: %s", self.job_id, exc)

    def flush_usage(self, all_threads: bool = False) -> None:
        """Write the usage of calls no item write carried (an item that failed, an attempt
        that ends): they were paid for."""
        pending = self.meter.take_all() if all_threads else [p for p in [self.meter.take()] if p]
        for entry in pending:  # answers no item stored serve the next attempt: never paid twice
            entry.keep_answers = True
        if pending:
            # At the attempt's end, answers it received wait for Redis as long as it takes
            # (LEASH_USAGE_HOLD_SECONDS): they were paid for.
            flush_usage(self.attempt, pending, patience=settings().usage_hold_seconds if all_threads else None)

    def items_done(self) -> dict[int, Any]:
        """Results already stored by earlier attempts (the resume point)."""
        raw = self.connection.hgetall(keys.items(self.job_id))
        return {int(k): json.loads(v) for k, v in raw.items()}

    def for_each(self, items: Iterable[Any], fn: Callable[[Any], Any], concurrency: int | None = None) -> list[Any]:
        """Apply ``fn`` to each item not done yet, several at once, checkpointing each result
        as it finishes; returns all results in order (earlier attempts' included).

        At most ``LEASH_ITEM_CONCURRENCY`` items run at once; a kind (``concurrency``) or a job
        (payload field ``item_concurrency``) may ask for fewer. ``fn`` runs on worker threads.
        """
        items = list(items)
        done = self.items_done()
        self.progress(len(done), total=len(items))
        return ItemRun(self, items, fn, self.item_concurrency(concurrency)).run(done)

    def item_concurrency(self, asked: int | None = None) -> int:
        """Items at once: the worker's limit, or less if the kind or the job asks for less."""
        width = settings().item_concurrency
        for wish in (asked, self.payload.get(CONCURRENCY_FIELD)):
            if isinstance(wish, int) and not isinstance(wish, bool) and wish >= 1:
                width = min(width, wish)
        return width

    # --- for jobs.core.running.items: which heartbeat counts, and when to stop --------------------------

    def enter_items(self, stop: StopReason, renewer: Renewer) -> None:
        self._stop, self._renewer = stop, renewer

    def leave_items(self) -> None:
        self._stop, self._renewer = None, None

    def heartbeat_done(self) -> int | None:
        """What a renewal records as ``done``: inside an item run, None (the script counts the
        stored items: another thread may have stored one a moment ago); else the last progress."""
        return None if self._stop is not None else self.attempt.done

    def stopping(self) -> threading.Event | None:
        """Set once the item run launches nothing new (None outside one)."""
        return self._stop.event if self._stop is not None else None

    def once(self, name: str, effect: Callable[[], Any]) -> bool:
        """Run a side effect at most once per job (see jobs.effects). Checks the lease first,
        so an attempt that already lost the job does not get through."""
        self.progress(self.attempt.done)
        return effects.once(self.connection, self.job_id, name, effect, token=self.attempt.token)

    def renew(self) -> None:
        """Renew the lease without changing progress (a job that is waiting, not stuck)."""
        self._after_heartbeat(self.attempt.heartbeat(done=self.heartbeat_done()))

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` and stay alive: the lease is renewed every third of its length,
        so a job waiting for a rate limit is never mistaken for a dead one. Inside an item run that
        is stopping, raises NotStarted at once: the item waiting here never starts."""
        deadline = clock.monotonic() + seconds
        step = self.attempt.lease_seconds / 3
        stopping = self.stopping() or threading.Event()
        while (left := deadline - clock.monotonic()) > 0:
            if stopping.wait(min(step, left)):
                raise NotStarted()
            self.renew()

    @contextmanager
    def keepalive(self, timeout: float) -> Iterator[None]:
        """Keep the lease alive while one long call (a model request that may outlast the
        lease) runs, for at most ``timeout`` seconds.

        After ``timeout`` the call no longer keeps the job alive: a call hung past its own
        timeout then lets the lease expire, and the reaper takes the job back. Inside an item run
        its one renewing thread serves every call and what it learns stops the run;
        outside one, a thread serves this call and what it learned (lease lost, cancel
        requested) is raised here when the block ends.
        """
        if self._renewer is not None:
            with self._renewer.call(timeout):
                yield
            return
        learned: list[BaseException] = []
        with Renewer(self, learned.append) as renewer, renewer.call(timeout):
            yield
        if learned:
            raise learned[0]
        # A hand-off waits for the next checkpoint, so the answer just received is kept.
