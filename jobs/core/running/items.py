"""Items of one attempt, many at once: the engine behind ``ctx.for_each``.

Up to ``concurrency`` items run at once, each on a thread of the work-horse (the SDKs are
synchronous and a model call spends its time waiting on the network; docs/BENCHMARKS.md has
the measurement against asyncio). What stays true with items in flight together:

- every item's result is one fenced write that also renews the lease (``Attempt.heartbeat``),
  made by the thread that computed it the moment it finishes, in whatever order items finish;
  a write from a superseded attempt is refused whichever thread sends it;
- ``done`` is the number of stored items (the Lua script counts them), never items launched;
- a cancel, a hand-off (SIGTERM) or a lost lease stops launching at once; calls in flight
  finish and are stored if the lease still holds, else refused; then the run raises it;
- one ``Renewer`` thread keeps the lease alive for every call in flight, each for at most its
  own timeout, so a call hung past its timeout stops keeping the job alive.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from itertools import count
from typing import TYPE_CHECKING, Any, Protocol

from jobs.core import clock
from jobs.errors import Canceled, HandOff, LeaseLost, Signal

if TYPE_CHECKING:
    from jobs.core.lease import Attempt

log = logging.getLogger("leash.items")

#: The payload field with which a job asks for fewer items at once than the worker allows.
CONCURRENCY_FIELD = "item_concurrency"


class NotStarted(Signal):
    """An item gave up before its call started because the run is stopping."""


# When several things stop a run at once, the one raised decides the attempt's fate: a lost
# lease means nothing may be written; a cancel is the user's word; a hand-off costs no attempt.
_PRECEDENCE = (LeaseLost, Canceled, HandOff)


class StopReason:
    """Why the run stops launching items (the first reason that matters most)."""

    def __init__(self):
        self.event = threading.Event()
        self._lock = threading.Lock()
        self.reason: BaseException | None = None

    def record(self, exc: BaseException) -> None:
        if isinstance(exc, NotStarted):
            return
        with self._lock:
            if self.reason is None or _rank(exc) < _rank(self.reason):
                self.reason = exc
            self.event.set()

    def is_set(self) -> bool:
        return self.event.is_set()


def _rank(exc: BaseException) -> int:
    for rank, kind in enumerate(_PRECEDENCE):
        if isinstance(exc, kind):
            return rank
    return len(_PRECEDENCE)


class Renewer:
    """One thread renewing the lease while any registered call is within its timeout.

    A call registers for the length of its own timeout; once every registered call is past
    its deadline the thread stops renewing (a hung call must let the lease expire). What a
    renewal learns — a cancel, a lost lease — goes to ``on_signal``.
    """

    def __init__(self, ctx: ItemContext, on_signal: Callable[[BaseException], None]):
        self.ctx = ctx
        self.on_signal = on_signal
        self.interval = ctx.attempt.lease_seconds / 3
        self._deadlines: dict[int, float] = {}
        self._ids = count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"leash-keepalive-{ctx.job_id}", daemon=True)

    def __enter__(self) -> Renewer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        # Joined before the attempt writes its outcome: a renewal after ``finish`` would be
        # refused and would mark the attempt superseded.
        self._stop.set()
        self._thread.join()

    @contextmanager
    def call(self, timeout: float):
        with self._lock:
            call_id = next(self._ids)
            self._deadlines[call_id] = clock.monotonic() + timeout
        try:
            yield
        finally:
            with self._lock:
                del self._deadlines[call_id]

    def _run(self) -> None:
        warned = False
        while not self._stop.wait(self.interval):
            with self._lock:
                now = clock.monotonic()
                alive = sum(1 for deadline in self._deadlines.values() if deadline > now)
                hung = len(self._deadlines) - alive
            if not alive:
                if hung and not warned:
                    log.warning("job %s: %d call(s) still running past their timeout; no longer renewing "
                                "the lease for them", self.ctx.job_id, hung)
                    warned = True
                continue
            try:
                if self.ctx.attempt.heartbeat(done=self.ctx.heartbeat_done()):
                    self.on_signal(Canceled())
            except LeaseLost as exc:
                self.on_signal(exc)
                return
            except Exception as exc:  # a Redis blip: the next round may get through
                log.warning("job %s: keepalive heartbeat failed: %s", self.ctx.job_id, exc)


class ItemContext(Protocol):
    """What the engine uses of the job's context (``jobs.core.running.context.JobContext``, which runs it)."""

    attempt: Attempt
    job_id: str

    def heartbeat_done(self) -> int | None: ...
    def enter_items(self, stop: StopReason, renewer: Renewer) -> None: ...
    def leave_items(self) -> None: ...
    def checkpoint_encoded(self, index: int, encoded: str) -> None: ...
    def flush_usage(self, all_threads: bool = False) -> None: ...


class ItemRun:
    """One ``for_each`` call: the items left to do, run ``concurrency`` at a time."""

    def __init__(self, ctx: ItemContext, items: Sequence[Any], fn: Callable[[Any], Any], concurrency: int):
        self.ctx = ctx
        self.items = items
        self.fn = fn
        self.concurrency = max(1, concurrency)
        self.stop = StopReason()
        self.results: dict[int, Any] = {}

    def run(self, done: dict[int, Any]) -> list[Any]:
        self.results = dict(done)
        todo = [i for i in range(len(self.items)) if i not in done]
        width = min(self.concurrency, len(todo))
        if todo:
            log.info("job %s: %d of %d items to do, up to %d at once", self.ctx.job_id, len(todo),
                     len(self.items), width)
            with Renewer(self.ctx, self.stop.record) as renewer:
                self.ctx.enter_items(self.stop, renewer)
                try:
                    with ThreadPoolExecutor(width, thread_name_prefix=f"leash-item-{self.ctx.job_id}") as pool:
                        try:
                            self._dispatch(pool, todo, width)
                        except BaseException as exc:  # e.g. RQ's job timeout: waiting items must not start
                            self.stop.record(exc)
                            raise
                finally:
                    self.ctx.leave_items()
        if self.stop.reason is not None:
            raise self.stop.reason
        return [self.results[i] for i in range(len(self.items))]

    def _dispatch(self, pool: ThreadPoolExecutor, todo: list[int], width: int) -> None:
        in_flight: set[Future] = set()
        for index in todo:
            while len(in_flight) >= width:
                finished, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in finished:
                    future.result()  # _run_one records its errors; this only re-raises bugs here
            if self.ctx.attempt.handoff_requested:
                self.stop.record(HandOff())
            if self.stop.is_set():
                break
            in_flight.add(pool.submit(self._run_one, index))
        wait(in_flight)  # calls in flight finish (each bounded by its own timeout)

    def _run_one(self, index: int) -> None:
        if self.stop.is_set():
            return
        try:
            value = self.fn(self.items[index])
            encoded = json.dumps(value)
        except BaseException as exc:
            self.ctx.flush_usage()  # no item to carry the calls it made: counted all the same
            self.stop.record(exc)
            return
        try:
            self.ctx.checkpoint_encoded(index, encoded)
        except (Canceled, HandOff) as exc:  # learned after the write landed: the item is stored
            self.results[index] = value
            self.stop.record(exc)
            return
        except BaseException as exc:
            self.stop.record(exc)
            return
        self.results[index] = value
