"""Expired request-cache entries leave the cache's index and byte count on the workers' sweep,
not only at the next cache write: a cache nobody writes to any more counts only what Redis holds."""

from __future__ import annotations

import time

from jobs import keys
from jobs.models import cache


def test_a_workers_sweep_drops_expired_entries_from_the_index_and_keeps_live_ones(conn, burst, env):
    env.setenv("LEASH_CACHE_DAYS", "1")
    now = time.time()
    expired = [keys.cache_entry("shared", f"gone{n}") for n in range(420)]
    live = keys.cache_entry("shared", "live")
    # Written as the cache leaves them: the expired answers are gone from Redis (their TTL ran
    # out), their index entries last used more than LEASH_CACHE_DAYS ago; the live one is fresh.
    conn.zadd(keys.CACHE_INDEX, {name: now - 2 * 86400 for name in expired} | {live: now - 60})
    conn.hset(keys.CACHE_SIZES, mapping={name: 500 for name in expired} | {live: 700})
    conn.set(keys.CACHE_BYTES, 420 * 500 + 700)
    conn.set(live, "an answer", ex=86400)

    burst()  # a worker's turn: nothing queued, its periodic work runs once

    assert conn.zrange(keys.CACHE_INDEX, 0, -1) == [live.encode()]
    assert conn.hgetall(keys.CACHE_SIZES) == {live.encode(): b"700"}
    assert int(conn.get(keys.CACHE_BYTES)) == 700 and conn.get(live) == b"an answer"
    assert cache.sweep(conn) == 0
