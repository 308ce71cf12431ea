"""The request cache: a request leash already paid for is not paid for again.

The key is a digest of the whole request as sent (``request_digest``): the backend and its
address, the model, the temperature, and every field of the ``CallRequest`` the provider sees --
the messages, ``max_tokens``, and any field a later release adds (a response schema) without
this module naming it. Two requests that differ in anything the provider is sent are two
entries; the same request is one, whichever job, mode (direct or batch) or attempt sends it.

Whose answers a request may reuse (``LEASH_CACHE_SCOPE``): its owner's own (``owner``, the
default: a shared cache would tell one owner what another asked), or anyone's (``shared``).
A job bypasses the cache with payload ``cache: false`` (it neither reads nor writes it);
``LEASH_CACHE=off`` turns it off for every job.

Reading an entry is one GET (a batch job's items: one MGET); a hit is counted (``cache_hits``)
and costs nothing. Writing rides on the write that stores the item (heartbeat_v4,
store_items_v2: ``cache_write`` in jobs/lua/_lib.lua), which also refreshes the entries hits
used and drops entries past ``LEASH_CACHE_DAYS`` or, past ``LEASH_CACHE_MAX_MB``, the least
recently used -- leash's own cap, never a Redis eviction policy. Workers also ``sweep`` the
expired entries out of the index and the byte count every SWEEP_EVERY seconds, so a cache nobody
writes to does not go on counting answers Redis no longer holds.

Only an answer leash kept is cached: one the item used as its result (a label among the
labels, an object that follows the schema, a completion that ended on its own). An off-label
answer, a failed correction, an answer still invalid after its repairs, an answer cut off at
``max_tokens`` are paid for and counted, never stored here: a re-run asks exactly those requests
again. An entry carries the mark ``KEPT``; one without it (written before answers were judged
first) is read as a miss, so an answer thrown away is never served, nor its entry refreshed.

A request with a temperature above 0 asks for randomness; its cached answer is one sample,
reused as it is: the request is the same, and the cache is on by the job's owner's choice (see
docs/MODELS.md, "The request cache").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from jobs import keys
from jobs.config import answer_cache
from jobs.core import clock
from jobs.lifecycle import scripts
from jobs.models.provider import CUT_OFF, Answer, CallRequest, Usage

if TYPE_CHECKING:
    from redis import Redis

#: Where an answer that left Redis is looked up: {entry key: raw answer} of the entries asked
#: for, given the Redis connection they were missed in (jobs.archive.answers.lookup, set by the
#: web app and every ``leash`` command at start; ``leash worker`` sets lookup_to_use, which marks
#: the answers used: the models sit below the archive). None: Redis only.
archived: Callable[[list[str], Redis], dict[str, str]] | None = None

#: CallRequest fields leash keeps for itself: never sent to the provider, so not in the key.
NOT_SENT = frozenset({"truncation_ok", "budget_cut"})
CACHE_FIELD = "cache"
NO_USAGE = Usage(0, 0)


def request_digest(backend: str, url: str, model: str, temperature: float | None, request: CallRequest) -> str:
    """The request as sent, in one digest: every field of ``request`` but NOT_SENT, by name."""
    sent = {f.name: getattr(request, f.name) for f in dataclasses.fields(request) if f.name not in NOT_SENT}
    whole = [backend, url, model, temperature, sent]
    return hashlib.sha256(json.dumps(whole, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def enabled(payload: dict | None) -> bool:
    """Whether a job with this payload uses the cache (LEASH_CACHE, payload ``cache``)."""
    cached = answer_cache()
    if str(cached.cache).strip().lower() in ("off", "0", "false", "no"):
        return False
    if cached.cache_max_mb <= 0:
        return False
    return not (payload is not None and payload.get(CACHE_FIELD) is False)


def shared_scope() -> bool:
    """Whether every owner's requests reuse everyone's answers (LEASH_CACHE_SCOPE=shared)."""
    return str(answer_cache().cache_scope).strip().lower() == "shared"


def scope_of(owner: str) -> str:
    """The key scope of ``owner``'s requests (LEASH_CACHE_SCOPE)."""
    return keys.cache_scope(None if shared_scope() else owner)


def check_settings() -> None:
    """ValueError naming the setting when LEASH_CACHE or LEASH_CACHE_SCOPE is not one of its words."""
    cached = answer_cache()
    if str(cached.cache).strip().lower() not in ("on", "off", "1", "0", "true", "false", "yes", "no"):
        raise ValueError(f"LEASH_CACHE must be on or off, got {cached.cache!r}")
    if str(cached.cache_scope).strip().lower() not in ("owner", "shared"):
        raise ValueError(f"LEASH_CACHE_SCOPE must be owner or shared, got {cached.cache_scope!r}")


#: The mark of an entry whose answer its item kept (see the module's docstring).
KEPT = "kept"


def cacheable(answer: Answer, request: CallRequest) -> bool:
    """Whether an answer may be cached once its item keeps it: it has text, it ended on its own
    (not cut off at max_tokens), and it answers the request as asked (not a budget's shortened
    one)."""
    return answer.text is not None and answer.finish != CUT_OFF and not request.budget_cut


def encode(answer: Answer) -> str:
    return json.dumps([answer.text, answer.finish, answer.stop_reason, KEPT], separators=(",", ":"))


def decode(raw) -> Answer | None:
    try:
        text, finish, stop, mark = json.loads(raw)
    except (TypeError, ValueError):
        return None  # not an entry of this form (an older release's, unjudged): a miss
    if mark != KEPT or not isinstance(text, str) or finish == CUT_OFF:
        return None
    return Answer(text, finish, stop, NO_USAGE)


class RequestCache:
    """One job's view of the cache: its scope, and whether it uses the cache at all."""

    def __init__(self, connection: Redis, owner: str, payload: dict | None):
        check_settings()  # ValueError naming the setting
        self.connection = connection
        self.on = enabled(payload)
        self.scope = scope_of(owner) if self.on else ""

    def key(self, digest: str) -> str:
        return keys.cache_entry(self.scope, digest)

    def get(self, digest: str) -> Answer | None:
        return self.get_many([digest])[0]

    def get_many(self, digests: Sequence[str]) -> list[Answer | None]:
        """Each request's cached answer (None: a miss), in one round trip (and one archive query
        for those that left Redis)."""
        if not self.on or not digests:
            return [None] * len(digests)
        names = [self.key(d) for d in digests]
        raws = self.connection.mget(names)
        missed = [name for name, raw in zip(names, raws, strict=True) if raw is None]
        if missed and archived is not None:
            found = archived(missed, self.connection)
            raws = [found.get(name) if raw is None else raw for name, raw in zip(names, raws, strict=True)]
        return [None if raw is None else decode(raw) for raw in raws]



#: How often each worker sweeps expired entries out of the cache's index (seconds), and at most
#: how many one sweep drops (the next takes the rest).
SWEEP_EVERY, SWEEP_MOST = 60.0, 1000


def sweep(connection: Redis, now: float | None = None) -> int:
    """Drop the entries whose last use is older than LEASH_CACHE_DAYS from the cache's index,
    sizes and byte total (cache_sweep_v1); returns how many."""
    now = clock.wall() if now is None else now
    ttl = max(1, round(answer_cache().cache_days * 86400))
    return int(scripts.run(connection, "cache_sweep_v1", keys={
        "cache_index": keys.CACHE_INDEX, "cache_sizes": keys.CACHE_SIZES, "cache_bytes": keys.CACHE_BYTES},
        args=[now, ttl, SWEEP_MOST]))
