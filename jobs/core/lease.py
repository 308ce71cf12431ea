"""The lease: each claim of a job is an attempt with a fencing token.

Every write an attempt makes — heartbeat, checkpoint, success, failure, hand-off — is a Lua
script that first checks the job is still ``running`` under that attempt's token. A worker
that lost its lease (a zombie: stopped, partitioned, orphaned) can keep computing, but
nothing it writes lands; it learns so from ``LeaseLost`` at its next heartbeat.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

import redis
from redis import Redis
from rq.utils import now as rq_now
from rq.utils import utcformat

from jobs import keys
from jobs.config import batches, settings
from jobs.core import clock, error_text
from jobs.core.details import truncate
from jobs.core.outcome import STOPPED_BY_RQ
from jobs.core.store.connection import is_out_of_memory
from jobs.core.store.memory_wait import MemoryWait
from jobs.errors import CANCELED, LeaseLost
from jobs.lifecycle import transitions
from jobs.usage.meter import Pending, cache_args, write_args

_memory_wait = MemoryWait(logging.getLogger("leash.worker"), "the running job")

#: A failed attempt's whole error (its steps too), as its entry in the job's error history keeps
#: it: at most this many bytes as JSON (``leash status --full``, the archive). The job hash keeps
#: the LEASH_ERROR_MAX_CHARS cut every status answer carries.
FULL_ERROR_BYTES = 16 * 1024


def error_entry(attempt: int, message: str, now: float) -> str:
    return json.dumps({"attempt": attempt, "at": now, "error": message})


def describe(exc: BaseException) -> str:
    """The stored error text: the exception line first, then the steps that led to it, without
    server paths (jobs.core.error_text), cut at FULL_ERROR_BYTES (``fail`` cuts the hash's copy)."""
    return truncate(error_text.describe(exc), FULL_ERROR_BYTES)


class Outcome(StrEnum):
    """How an attempt ended, which decides what the worker does next with RQ's side of the job.
    Set only by ``Attempt.settle``."""

    SUCCEEDED = "succeeded"  # its finish landed
    RETRY = "retry"  # failed; the job is queued for another attempt
    FAILED = "failed"  # failed for good (a cancel too)
    SUPERSEDED = "superseded"  # lost its lease: another attempt or the reaper owns the job now
    HANDED_OFF = "handed_off"  # given back to the front of its queue (deploy, Redis blip): not counted
    DEFERRED = "deferred"  # given back to wait (RetryLater): not counted
    RECLAIMED = "reclaimed"  # its work-horse died and its worker reclaimed the job at once
    PARKED = "parked"  # a batch job waiting at its provider, given back until its next look: not counted


@dataclass
class Attempt:
    """One claim of a job. Lives in the worker process that claimed it and its work-horse."""

    connection: Redis
    job_id: str
    token: str
    number: int
    queue: str
    lease_seconds: float
    rq_started_member: str = ""
    kind: str = ""
    worker_pid: int = 0  # the worker process that claimed; its death orphans the work-horse
    owner: str = ""  # whose usage this attempt's calls count against (read when first needed)
    handoff_requested: bool = False
    look: bool = False  # a look at a batch waiting at its provider (claim_v4): not an attempt
    outcome: Outcome | None = None  # set by settle()
    done: int = 0
    extra: dict = field(default_factory=dict)
    # Numbers this attempt's usage writes (next_write_id); next() on it is atomic in CPython.
    _write_numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1), init=False, repr=False)

    def next_write_id(self) -> str:
        """The id of a usage write: this thread and a number that only grows. A thread sends
        its writes one at a time, so a number at or below the last one counted for the thread
        (under this claim's token) is a write sent again after its reply was lost, and is not
        counted twice."""
        return f"{threading.get_ident():x}:{next(self._write_numbers)}"

    def settle(self, outcome: Outcome) -> None:
        """Record how this attempt ended (the one place it is set)."""
        self.outcome = outcome

    @cached_property
    def _item_keys(self) -> dict[str, str]:
        """The heartbeat's keys, built once per attempt: the heartbeat is the hot path."""
        return transitions.item_keys(self.connection, self.job_id, self.queue)

    @cached_property
    def usage_ttl(self) -> int:
        """How long the job's usage hash is kept past its last write: the results' time and a
        day (read once per attempt: the item write is the hot path)."""
        return settings().result_ttl + 24 * 3600

    def owner_name(self) -> str:
        if not self.owner:
            self.owner = (self.connection.hget(keys.job(self.job_id), "owner") or b"").decode()
        return self.owner

    def write(self, transition: Callable[..., Any], *call: Any, patience: float | None = None) -> tuple[Any, bool]:
        """Run a fenced transition (``transition(connection, *call)``), riding out a Redis blip
        (failover, restart) for as long as the lease lasts — after that the lease is gone
        anyway — and a full Redis (refused writes) until memory is freed or the job's timeout
        stops the work-horse: the write lands then, or is refused if the job was reclaimed
        meanwhile. Returns (reply, retried): a retried call may have landed the first time with
        its reply lost, which callers resolve.
        ``patience``: how long to ride out a blip instead (an unfenced write of paid usage
        outlives the lease), asking again at least once a second."""
        deadline = clock.monotonic() + (self.lease_seconds if patience is None else patience)
        delay, retried = 0.1, False
        longest = 2.0 if patience is None else 1.0
        while True:
            try:
                reply = transition(self.connection, *call), retried
                _memory_wait.accepted()
                return reply
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                if clock.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay, retried = min(delay * 2, longest), True
            except redis.exceptions.ResponseError as exc:
                if not is_out_of_memory(exc):
                    raise
                # A refused script wrote nothing: Redis refuses a script's write for memory only
                # while the script has written nothing yet (it cannot stop one halfway).
                _memory_wait.sleep(exc)

    def landed(self, *states_: str) -> list | None:
        """After a retried call was refused: did the first try land? (Same token, and the job
        in a state that call leads to.) Returns the job's attempts/max_attempts/state if so."""
        state, token, attempts, max_attempts = self.connection.hmget(
            keys.job(self.job_id), "state", "token", "attempts", "max_attempts")
        if token is not None and token.decode() == self.token and state is not None and state.decode() in states_:
            return [state.decode(), int(attempts or 0), int(max_attempts or 0)]
        return None

    def heartbeat(self, done: int | None = None, total: int | None = None,
                  item: tuple[int, str] | None = None, now: float | None = None,
                  usage: Pending | None = None) -> bool:
        """Renew the lease and record progress (and an item's result, and the usage of the
        model calls behind it) atomically. The usage is counted even if the write is refused.

        Returns whether a cancel was requested. Raises LeaseLost for a superseded attempt.
        """
        now = clock.wall() if now is None else now
        reply, _ = self.write(transitions.heartbeat, *self._heartbeat_call(done, total, item, now, usage))
        if int(reply[0]) != 1:
            self.settle(Outcome.SUPERSEDED)
            raise LeaseLost()
        self.done = int(reply[2])
        return reply[1] in (b"1", "1")

    def _heartbeat_call(self, done, total, item, now, usage) -> tuple:
        usage_keys, usage_args = write_args(self, usage, now)
        cache_keys, cache_argv = cache_args(usage)
        return self._item_keys, usage_keys, cache_keys, [
            self.job_id, self.token, now, self.lease_seconds,
            "" if done is None else int(done),
            "" if total is None else int(total),
            "" if item is None else int(item[0]),
            "" if item is None else item[1],
            self.rq_started_member,
            "0" if self.orphaned() else "1",
            *usage_args, *cache_argv]

    def store_items(self, entries: list[tuple[int, str, str]], usage: Pending | None,
                    now: float | None = None) -> bool:
        """Many items' results in one fenced write (store_items_v2): each ``(index, result JSON,
        "calls,input,output,hits")``, with ``usage`` (the calls behind them all, counted even if
        refused) and its cache entries. Returns whether a cancel was requested; LeaseLost if superseded."""
        now = clock.wall() if now is None else now
        usage_keys, usage_args = write_args(self, usage, now)
        items = [value for entry in entries for value in entry]
        cache_keys, cache_argv = cache_args(usage)
        reply, _ = self.write(
            transitions.store_items, self._item_keys, usage_keys, cache_keys,
            [self.job_id, self.token, now, self.lease_seconds, self.rq_started_member,
             "0" if self.orphaned() else "1", *usage_args, len(entries), *items, *cache_argv])
        if usage is not None:
            # /metrics lists the models of this set: direct calls join it through their
            # concurrency gate, a model used only through its batch API joins it here.
            self.connection.sadd(keys.MODELS, usage.model)
        if int(reply[0]) != 1:
            self.settle(Outcome.SUPERSEDED)
            raise LeaseLost()
        self.done = int(reply[2])
        return reply[1] in (b"1", "1")

    def record_usage(self, usage_keys: dict[str, str], args: list, patience: float | None = None) -> None:
        """Usage with no item to ride on (``jobs.usage.meter.flush``), riding out a blip."""
        self.write(transitions.usage_record, self.job_id, usage_keys, args, patience=patience)

    def orphaned(self) -> bool:
        """True in a work-horse whose worker process died (it was re-parented). Such a
        horse may finish its current item, but no longer renews the lease: its worker is not
        there to finish the job's bookkeeping, so the job must be reclaimed."""
        return bool(self.worker_pid) and os.getppid() != self.worker_pid and os.getpid() != self.worker_pid

    def finish(self, result: dict, now: float | None = None, outcome: str = "succeeded") -> None:
        """``outcome`` names the all-time total it counts in (/metrics): ``succeeded``, or
        ``succeeded_with_item_errors`` (jobs/core/outcome.py)."""
        now = clock.wall() if now is None else now
        self.settle_abandoned(now)
        ok, retried = self.write(
            transitions.finish, self.job_id, self.owner_name(), self.kind, now,
            [self.job_id, self.token, now, json.dumps(result, separators=(",", ":")), settings().result_ttl,
             f"{outcome}:{self.kind}", keys.STATS_MINUTE_TTL],
        )
        if int(ok) != 1 and not (retried and self.landed("succeeded")):
            self.settle(Outcome.SUPERSEDED)
            raise LeaseLost()
        self.settle(Outcome.SUCCEEDED)

    def settle_abandoned(self, now: float) -> None:
        """As an attempt starts, and before it ends the job (or queues it again): calls of the
        job's killed work-horses that still hold reservations are counted as estimated calls
        now, their room freed, not when their deadlines pass (reservations_settle_v1)."""
        self.write(transitions.settle_abandoned, self.job_id, self.owner_name(),
                   [self.token, f"{self.job_id}:", now])

    def fail(self, message: str, permanent: bool, now: float | None = None, reason: str | None = None) -> str:
        """Record this attempt's error (``reason``: its history entry's text, if another): the
        history entry keeps it up to FULL_ERROR_BYTES, the job hash its LEASH_ERROR_MAX_CHARS
        cut. Returns the new state (queued or failed)."""
        now = clock.wall() if now is None else now
        whole, message = truncate(reason or message, FULL_ERROR_BYTES), truncate(message)
        # A cancel (or RQ's stop command) ends in failed too, but is counted apart: alerts are
        # about failures.
        outcome = "canceled" if message == CANCELED else "stopped" if message == STOPPED_BY_RQ else "failed"
        self.settle_abandoned(now)
        reply, retried = self.write(
            transitions.fail, self.job_id, self.owner_name(), outcome, self.kind, now,
            [self.job_id, self.token, now, message, 1 if permanent else 0,
             settings().result_ttl, error_entry(self.number, whole, now),
             f"{outcome}:{self.kind}", keys.STATS_MINUTE_TTL],
        )
        if int(reply[0]) != 1 and retried:
            landed = self.landed("queued", "failed")
            if landed:
                reply = [1, landed[0], landed[1], landed[2]]
        if int(reply[0]) != 1:
            self.settle(Outcome.SUPERSEDED)
            return "superseded"
        new_state = reply[1].decode() if isinstance(reply[1], bytes) else reply[1]
        self.extra["attempts_left"] = int(reply[3]) - int(reply[2])
        self.settle(Outcome.RETRY if new_state == "queued" else Outcome.FAILED)
        return new_state

    def release(self, now: float | None = None, requeue: bool = True) -> int:
        """Give the job back without counting the attempt: to the front of the queue
        (deploy hand-off), or, with ``requeue=False``, for RQ's scheduler to bring back
        later (deferral). Returns 0 if superseded, else 1 / the job's deferral count."""
        now = clock.wall() if now is None else now
        ok, retried = self.write(
            transitions.release, self.job_id, self.owner_name(), self.queue,
            [self.job_id, self.token, now, utcformat(rq_now()), "1" if requeue else "0", look_grace()],
        )
        if int(ok) == 0 and retried and self.landed("queued"):
            ok = 1
        if int(ok) == 0:
            self.settle(Outcome.SUPERSEDED)
        else:
            self.settle(Outcome.HANDED_OFF if requeue else Outcome.DEFERRED)
        return int(ok)

    def park(self, look_at: float, progress: tuple, now: float | None = None, stage: str = "waiting",
             failed_looks: int = 0) -> int:
        """Give the worker back while the provider works on the job's batch (park_v1): the
        job stays running, waiting, until a look at ``look_at``. ``progress`` is the provider's
        (done, failed, total, batches), '' for a count that stays as it was; ``stage`` is
        ``waiting`` or ``canceling`` (its batch canceled, read once it ends), ``failed_looks``
        the looks in a row the provider did not answer. Returns 1 parked, 2 a cancel was asked
        for, 0 superseded."""
        now = clock.wall() if now is None else now
        reply, retried = self.write(
            transitions.park, self.job_id,
            [self.job_id, self.token, now, look_at, look_grace(), *progress, stage, failed_looks])
        if int(reply) == 0 and retried:
            phase = self.connection.hget(keys.job(self.job_id), "phase")
            reply = 1 if phase == b"waiting" else 0
        if int(reply) in (0, 1):
            self.settle(Outcome.PARKED if int(reply) == 1 else Outcome.SUPERSEDED)
        return int(reply)

    def abandon(self, message: str, now: float | None = None) -> str | None:
        """The work-horse running this attempt died: reclaim at once instead of waiting for
        the lease to run out. Returns the new state, or None if the attempt was superseded."""
        return reclaim(self.connection, self.job_id, self.queue, message, now=now, token=self.token)


def owner_of(connection: Redis, job_id: str) -> str:
    """The job's owner ("" for an unknown job: its scripts then change nothing)."""
    owner = connection.hget(keys.job(job_id), "owner")
    return owner.decode() if owner else ""


def claim(connection: Redis, job_id: str, queue: str, worker: str,
          now: float | None = None) -> Attempt | None:
    """Start an attempt on a queued job; None when the job is not claimable."""
    now = clock.wall() if now is None else now
    lease_seconds = settings().lease_seconds
    owner = owner_of(connection, job_id)  # never changes: safe to read before the claim
    reply = transitions.claim(
        connection, job_id, owner,
        # The history outlives the job's record by a margin: the record's TTL starts when the
        # job ends, which is after its last claim. The last two make the token unique even
        # when a failover loses this claim (see claim_v4.lua).
        [job_id, now, lease_seconds, worker, 2 * settings().result_ttl,
         int(now * 1_000_000), secrets.randbelow(1 << 20)],
    )
    if int(reply[0]) != 1:
        return None
    kind = reply[3].decode() if isinstance(reply[3], bytes) else reply[3]
    return Attempt(connection, job_id, token=str(int(reply[1])), number=int(reply[2]),
                   queue=queue, lease_seconds=lease_seconds, kind=kind, worker_pid=os.getpid(), owner=owner,
                   look=reply[4] in (b"1", "1"))


def look_grace() -> float:
    """How late a look at a waiting batch may be before the job reads as stale: a worker may
    be busy with another job when the look is due (one lease, and at least a poll interval)."""
    return max(settings().lease_seconds, batches().batch_poll_seconds, 30.0)


def reclaim(connection: Redis, job_id: str, queue: str, message: str,
            now: float | None = None, token: str | None = None) -> str | None:
    """Take back a running job whose lease expired (or, with ``token``, whose attempt is
    known dead). Returns the new state (queued or failed) or None if nothing was done."""
    now = clock.wall() if now is None else now
    number, kind, owner = connection.hmget(keys.job(job_id), "attempts", "kind", "owner")
    kind = (kind or b"").decode()
    reply = transitions.reclaim(
        connection, job_id, (owner or b"").decode(), queue, kind, now,
        [job_id, now, message, error_entry(int(number or 0), message, now),
         settings().result_ttl, utcformat(rq_now()), token or "",
         f"failed:{kind}", keys.STATS_MINUTE_TTL],
    )
    if int(reply[0]) != 1:
        return None
    return reply[1].decode() if isinstance(reply[1], bytes) else reply[1]
