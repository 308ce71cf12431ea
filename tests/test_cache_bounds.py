"""The request cache's bounds, on the Lua side against a real Redis: the item write that stores
answers keeps the cache under LEASH_CACHE_MAX_MB by evicting the least recently used entries
(a hit's write makes an entry recent again), drops entries unused for LEASH_CACHE_DAYS, and keeps
its byte count equal to the sizes of the entries it holds."""

from __future__ import annotations

from jobs import keys
from jobs.core import lease
from jobs.enqueue import enqueue
from jobs.usage.meter import Pending, cache_entry_size

NOW = 1_790_000_000.0
ANSWER = '["' + "x" * 200 + '","complete",null]'


def entry(n: int) -> str:
    return keys.cache_entry(keys.cache_scope("alice"), f"{n:032d}")


def write(attempt, item: int, now: float, new=(), touched=()) -> None:
    pending = Pending("m", "prompt", cache={entry(n): ANSWER for n in new}, touched=[entry(n) for n in touched])
    attempt.heartbeat(item=(item, '"a"'), now=now, usage=pending)


def test_the_least_recently_used_go_first_and_the_count_stays_exact(conn, env):
    size = cache_entry_size(entry(0), ANSWER)
    env.setenv("LEASH_CACHE_MAX_MB", str(4 * size / 1024 / 1024))  # room for four entries
    job_id, _ = enqueue(conn, "prompt", {"items": ["a"] * 8, "template": "{item}"}, owner="alice", now=NOW)
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    write(attempt, 0, NOW, new=[0, 1, 2, 3])
    write(attempt, 1, NOW + 1, touched=[0])  # a hit on entry 0: recent again
    write(attempt, 2, NOW + 2, new=[4, 5])

    kept = {int(k.decode().rsplit(":", 1)[1]) for k in conn.zrange(keys.CACHE_INDEX, 0, -1)}
    assert kept == {0, 3, 4, 5}  # 1 and 2 were the least recently used
    assert not conn.exists(entry(1)) and not conn.exists(entry(2)) and conn.exists(entry(0))
    assert int(conn.get(keys.CACHE_BYTES)) == 4 * size == sum(int(v) for v in conn.hvals(keys.CACHE_SIZES))


def test_entries_unused_for_the_cache_days_are_dropped_and_uncounted(conn, env):
    env.setenv("LEASH_CACHE_DAYS", "1")
    job_id, _ = enqueue(conn, "prompt", {"items": ["a"] * 8, "template": "{item}"}, owner="alice", now=NOW)
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    write(attempt, 0, NOW, new=[0, 1])
    assert 0 < conn.ttl(entry(0)) <= 86400
    conn.delete(entry(0), entry(1))  # as their expiry would
    write(attempt, 1, NOW + 86400 + 5, new=[2])  # a day and a bit later

    assert [k.decode() for k in conn.zrange(keys.CACHE_INDEX, 0, -1)] == [entry(2)]
    assert int(conn.get(keys.CACHE_BYTES)) == cache_entry_size(entry(2), ANSWER)


def test_a_cache_setting_that_is_not_one_of_its_words_is_named(conn, env):
    import pytest

    from jobs.errors import InvalidJob
    from jobs.intake.submission import dry_run

    env.setenv("LEASH_MODEL_URL", "http://127.0.0.1:9/v1")
    env.setenv("LEASH_MODEL_NAME", "m")
    env.setenv("LEASH_CACHE_SCOPE", "everyone")
    with pytest.raises(InvalidJob, match="LEASH_CACHE_SCOPE must be owner or shared"):
        dry_run(conn, "prompt", {"items": ["a"], "template": "{item}"}, owner="alice")


def test_cache_hits_are_counted_on_the_item_the_owners_day_and_metrics(conn, env):
    from jobs.usage.report import owner_usage
    from tests.test_web_metrics import samples
    from tests.web_support import create_app_with

    job_id, _ = enqueue(conn, "prompt", {"items": ["a"] * 2, "template": "{item}"}, owner="alice", now=NOW)
    attempt = lease.claim(conn, job_id, "leash", "w", now=NOW)
    attempt.heartbeat(item=(0, '"a"'), now=NOW, usage=Pending("m", "prompt", hits=1, touched=[entry(9)]))
    conn.sadd(keys.MODELS, "m")
    assert conn.hget(keys.usage(job_id), "i0") == b"0,0,0,1"
    assert conn.hget(keys.job(job_id), "usage_cache_hits") == b"1"
    assert owner_usage(conn, "alice", days=1, now=NOW)["total"]["usage"]["cache_hits"] == 1
    found = samples(create_app_with().test_client().get("/metrics"))
    assert found[("leash_model_cache_hits_total", (("model", "m"),))] == 1


def test_the_key_is_the_whole_request_as_sent_and_nothing_leash_keeps_for_itself():
    from dataclasses import dataclass, replace

    from jobs.models.cache import request_digest
    from jobs.models.provider import CallRequest

    @dataclass(frozen=True)
    class WithSchema(CallRequest):  # a field a later release adds (a response schema)
        response_format: dict | None = None

    base = CallRequest([{"role": "user", "content": "hi"}], 64)
    key = request_digest("openai", "http://x/v1", "m", 0.0, base)
    changed = [request_digest("anthropic", "http://x/v1", "m", 0.0, base),
               request_digest("openai", "http://y/v1", "m", 0.0, base),
               request_digest("openai", "http://x/v1", "n", 0.0, base),
               request_digest("openai", "http://x/v1", "m", 0.7, base),
               request_digest("openai", "http://x/v1", "m", 0.0, replace(base, max_tokens=65)),
               request_digest("openai", "http://x/v1", "m", 0.0, replace(base, messages=[{"role": "user",
                                                                                           "content": "hi!"}])),
               request_digest("openai", "http://x/v1", "m", 0.0, WithSchema(base.messages, 64,
                                                                            response_format={"type": "json"}))]
    assert key not in changed and len(set(changed)) == len(changed)
    assert request_digest("openai", "http://x/v1", "m", 0.0, replace(base, truncation_ok=True)) == key
