"""Usage on its way to Redis: each item's calls wait here, on the item's thread, until the
write that stores the item carries them (heartbeat_v4) -- so accounting costs no extra round
trip. Calls with no item to ride on are written by ``flush`` (usage_record_v3). A call is
counted on the owner's UTC day it was admitted on, where its reservation was held, so the
write that settles the reservation lands in the same day: calls of different days wait apart.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jobs import keys
from jobs.config import answer_cache, settings

if TYPE_CHECKING:
    from jobs.usage.prices import Price

log = logging.getLogger("leash.usage")

def days_kept() -> int:
    """How many UTC days an owner's daily usage is kept (LEASH_USAGE_DAYS_KEPT; ``leash usage``
    reads back this far). ~730 bytes an owner-day: docs/OPERATIONS.md's sizing table."""
    return settings().usage_days_kept


def day_ttl() -> int:
    return days_kept() * 24 * 3600


def utc_day(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if now is None else now))


def follow_ups_field(model: str, kind: str) -> str:
    """The owner's day hash field counting, for ``model`` and ``kind``, the calls items made
    after their first (a repair, a correction): the price before a run expects as many."""
    return f"by|{model}|{kind}|follow_ups"


@dataclass
class Pending:
    """Calls of one model not yet written: what they used, cost, and the reservations they were
    admitted under (settled by the write), on the UTC ``day`` they were admitted ('' = the
    day of the write)."""

    model: str
    kind: str
    calls: int = 0
    input: int = 0
    output: int = 0
    cached: int = 0
    nusd: int = 0
    unpriced: int = 0
    estimated: int = 0
    day: str = ""
    reservations: list[str] = field(default_factory=list)
    #: Names the write that first carried these calls (Attempt.next_write_id): sent again --
    #: after a lost reply, or by the attempt's closing flush after the write gave up -- it is
    #: counted once (add_usage_once in jobs/lua/_lib.lua).
    write_id: str = ""
    #: The answers of these calls (request digest -> answer JSON), kept for the next attempt
    #: when the item write that would have stored them did not land (``Meter.keep``).
    answers: dict[str, str] = field(default_factory=dict)
    keep_answers: bool = False
    #: Requests answered from the request cache (no call, no cost), the cache entries to write
    #: (entry key -> answer JSON: the answers these calls received) and the entries the hits
    #: used (refreshed): written by the item's write (heartbeat_v4, store_items_v2).
    hits: int = 0
    cache: dict[str, str] = field(default_factory=dict)
    touched: list[str] = field(default_factory=list)
    #: The item's earlier calls (calls, input, output) already written apart (``Meter.settle``):
    #: in the item's own figures, not counted again.
    prior: tuple[int, int, int] = (0, 0, 0)

    def encode(self) -> str:
        """The usage JSON the scripts read."""
        # By hand, not dataclasses.asdict: this runs on every item write (the hot path).
        return json.dumps({"w": self.write_id, "model": self.model, "kind": self.kind, "calls": self.calls,
                           "input": self.input, "output": self.output, "cached": self.cached, "nusd": self.nusd,
                           "unpriced": self.unpriced, "estimated": self.estimated,
                           "r": self.reservations, **({"hits": self.hits} if self.hits else {})},
                          separators=(",", ":"))

    def item_usage(self) -> str:
        """The item's own figures, as the item write stores them: "calls,input,output,hits"."""
        calls, input_tokens, output = self.prior
        return f"{self.calls + calls},{self.input + input_tokens},{self.output + output},{self.hits}"


class Meter:
    """Pending usage per thread for one attempt (items run on several threads at once)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._pending: dict[int, Pending] = {}
        # A thread's finished calls of another model, or of the UTC day before: written with the
        # next item (take_spilled), before their reservations' deadlines pass; and usage whose
        # write raised (keep), for the attempt's closing flush.
        self._spilled: list[Pending] = []
        self._lock = threading.Lock()

    def _mine(self, model: str, day: str = "") -> Pending:
        ident = threading.get_ident()
        pending = self._pending.get(ident)
        if pending is None or pending.model != model or (day and pending.day and pending.day != day):
            if pending is not None and (pending.calls or pending.reservations or pending.hits):
                self._spilled.append(pending)
            pending = self._pending[ident] = Pending(model, self.kind, day=day)
        elif day and not pending.day:
            pending.day = day
        return pending

    def reserved(self, model: str, reservation: str, day: str) -> None:
        """The call was admitted under ``reservation``, on the UTC ``day`` it is counted on
        (settled when written). A call sent again keeps its reservation: named once."""
        with self._lock:
            pending = self._mine(model, day)
            if reservation not in pending.reservations:
                pending.reservations.append(reservation)

    def reservations(self, model: str) -> list[str]:
        """This thread's reservations not yet settled (an item's calls are written together)."""
        with self._lock:
            pending = self._pending.get(threading.get_ident())
            return list(pending.reservations) if pending is not None and pending.model == model else []

    def record(self, model: str, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0,
               estimated: bool = False, price: Price | None = None, batch: bool = False) -> None:
        """A call was answered (``estimated``: the server reported no usage): count it, at
        ``price`` (None: no price known, the cost is unknown), discounted when it ran in a
        provider's ``batch``."""
        with self._lock:
            pending = self._mine(model)
            pending.calls += 1
            pending.input += input_tokens
            pending.output += output_tokens
            pending.cached += cached_input_tokens
            pending.estimated += int(estimated)
            if price is None:
                pending.unpriced += 1
            else:
                pending.nusd += price.nano_usd(input_tokens, output_tokens, cached_input_tokens, batch=batch)

    def answered(self, model: str, digest: str, answer: str) -> None:
        """The answer of this thread's call, until its item is stored (then it is dropped)."""
        with self._lock:
            self._mine(model).answers[digest] = answer

    def cache_hit(self, model: str, entry_key: str) -> None:
        """This thread's request was answered from the request cache: counted, and its entry
        refreshed by the item's write."""
        with self._lock:
            pending = self._mine(model)
            pending.hits += 1
            pending.touched.append(entry_key)

    def to_cache(self, model: str, entry_key: str, answer: str) -> None:
        """An answer this thread's call received, for the request cache (the item's write
        stores it)."""
        with self._lock:
            self._mine(model).cache[entry_key] = answer

    def settle(self, model: str) -> Pending | None:
        """This thread's answered calls, taken out to be written before its item's next call (a
        repair, a correction) is admitted: their reservations settled at their real usage (their
        answers stay with the item, kept for the next attempt if it does not end). An item's
        follow-up then never waits for room its own item's answered calls hold, nor for room
        other items' answered calls hold while they wait for theirs (each writes its own first)
        -- only for calls in flight, which answer. Their figures stay with the item (``prior``),
        its cache entries and hits too. None when the thread has no answered call of ``model``."""
        with self._lock:
            ident = threading.get_ident()
            pending = self._pending.get(ident)
            if pending is None or pending.model != model or not pending.calls:
                return None
            carry = Pending(model, self.kind, hits=pending.hits, cache=pending.cache, touched=pending.touched,
                            answers=pending.answers, prior=(pending.prior[0] + pending.calls,
                                                            pending.prior[1] + pending.input,
                                                            pending.prior[2] + pending.output))
            pending.hits, pending.cache, pending.touched, pending.answers = 0, {}, [], {}
            pending.prior = (0, 0, 0)
            self._pending[ident] = carry
            return pending

    def take(self) -> Pending | None:
        """This thread's pending usage, for the write that stores its item."""
        with self._lock:
            return self._pending.pop(threading.get_ident(), None)

    def keep(self, pending: Pending) -> None:
        """Give back usage whose write did not land (it raised): the attempt's closing flush
        sends it again, under its first write id, with the answers it paid for (the next
        attempt uses them instead of asking again)."""
        pending.keep_answers = True
        with self._lock:
            self._spilled.append(pending)

    def take_spilled(self) -> list[Pending]:
        """Calls of another model or day that no write has carried yet (kept ones wait for the
        attempt's closing flush)."""
        with self._lock:
            spilled = [p for p in self._spilled if not p.write_id]
            self._spilled = [p for p in self._spilled if p.write_id]
        return spilled

    def take_all(self) -> list[Pending]:
        with self._lock:
            pending = list(self._pending.values()) + self._spilled
            self._pending, self._spilled = {}, []
        return pending


#: The names of a usage write's keys in the scripts' KEYS lines (write_args builds them).
USAGE_KEY_NAMES = ("usage", "owner_day", "model_usage", "reservations", "reservation_records")


def write_args(attempt, pending: Pending | None, now: float) -> tuple[dict[str, str], list]:
    """Keys (by name) and ARGV that add ``pending`` to the job, its attempt, the owner's day and the
    model, and settle its reservations (heartbeat_v4's KEYS[7..11] and ARGV[11..15];
    usage_record_v3's), on the day its calls were admitted."""
    if pending is None:
        # Nothing to count: the keys are passed but not touched.
        return dict.fromkeys(USAGE_KEY_NAMES, keys.usage(attempt.job_id)), ["", "", attempt.number, 0, 0]
    day = pending.day or utc_day(now)
    owner = attempt.owner_name()
    usage_keys = {"usage": keys.usage(attempt.job_id), "owner_day": keys.usage_owner_day(owner, day),
                  "model_usage": keys.usage_model(pending.model), "reservations": keys.owner_reservations(owner),
                  "reservation_records": keys.owner_reservation_records(owner)}
    if not pending.write_id:
        pending.write_id = attempt.next_write_id()
    return (usage_keys, [pending.encode(), day, attempt.number, attempt.usage_ttl, day_ttl()])


def write_now(attempt, entry: Pending, now: float | None = None) -> None:
    """Write ``entry`` (usage_record_v3: its usage, its reservations settled, its answers kept
    when ``keep_answers``) now, riding out a blip for as long as the lease lasts; raises when
    Redis does not take it (the caller keeps it for the attempt's closing flush)."""
    usage_keys, args = write_args(attempt, entry, time.time() if now is None else now)
    answers = entry.answers if entry.keep_answers else {}
    attempt.record_usage(usage_keys, [attempt.token] + args + [json.dumps(answers) if answers else ""])


def flush(attempt, pending: list[Pending], now: float | None = None, patience: float | None = None) -> None:
    """Write usage that has no item to ride on (usage_record_v3), and the answers of items whose
    write did not land, riding out a Redis blip (a repeat after a lost reply counts once): for
    as long as the lease lasts, or ``patience`` seconds -- an attempt that ends holding paid
    answers waits LEASH_USAGE_HOLD_SECONDS for Redis to take them. A write that still fails is
    logged, not raised over the attempt's outcome."""
    now = time.time() if now is None else now
    for entry in pending:
        answers = entry.answers if entry.keep_answers else {}
        if not entry.calls and not entry.reservations and not answers and not entry.hits:
            continue
        usage_keys, args = write_args(attempt, entry, now)
        try:
            attempt.record_usage(usage_keys, [attempt.token] + args + [json.dumps(answers) if answers else ""],
                                 patience=patience if entry.calls or answers else None)
        except Exception as exc:
            log.error("job %s: could not record the usage of %d call(s) it was answered (%s): Redis did not take "
                      "it", attempt.job_id, entry.calls, exc)


#: What one cache entry costs Redis beyond its answer and its key name's three copies (the
#: entry, its place in the index, its size): the keys' and members' own overhead, measured
#: (docs/BENCHMARKS.md, "The request cache").
CACHE_ENTRY_OVERHEAD = 210


def cache_entry_size(key: str, value: str) -> int:
    """The bytes the cap counts for one entry: its answer, its key name three times, and a
    fixed overhead."""
    return len(value.encode()) + 3 * len(key.encode()) + CACHE_ENTRY_OVERHEAD


def cache_args(pending: Pending | None) -> tuple[dict, list]:
    """Keys (by name) and ARGV that write ``pending``'s cache entries and refresh its hits' (cache_write
    in jobs/lua/_lib.lua): the cache's index, sizes and total, then the entries written and
    touched; the ttl, the cap, the count written and each entry's value and size."""
    index = {"cache_index": keys.CACHE_INDEX, "cache_sizes": keys.CACHE_SIZES, "cache_bytes": keys.CACHE_BYTES}
    if pending is None or not (pending.cache or pending.touched):
        return {**index, "cache_entries": []}, ["", 0, 0]
    cached = answer_cache()
    ttl = max(1, round(cached.cache_days * 86400))
    cap = int(cached.cache_max_mb * 1024 * 1024)
    args: list = [ttl, cap, len(pending.cache)]
    for key, value in pending.cache.items():
        args += [value, cache_entry_size(key, value)]
    return {**index, "cache_entries": list(pending.cache) + list(pending.touched)}, args
