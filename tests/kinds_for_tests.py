"""Job kinds used by the tests. Workers import this module through LEASH_IMPORTS.

Each records in Redis how often each item was computed, so tests can tell "resumed from the
checkpoint" from "started over"."""

from __future__ import annotations

import os
import time

from jobs.core.store.connection import connect
from jobs.errors import PermanentError
from jobs.kinds import kind, validate_items


def _calls_key(job_id: str) -> str:
    return f"test:calls:{job_id}"


def item_calls(connection, job_id: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in connection.hgetall(_calls_key(job_id)).items()}


@kind("count")
def count(ctx, payload):
    """Items take ``delay`` seconds each; every computation is counted per item."""
    conn = connect()
    delay = float(payload.get("delay", 0.1))

    def work(item):
        conn.hincrby(_calls_key(ctx.job_id), str(payload["items"].index(item)), 1)
        time.sleep(delay)
        return item.upper()

    results = ctx.for_each(payload["items"], work)
    if payload.get("effect"):
        ctx.once("notify", lambda: conn.incr(f"test:effect:{ctx.job_id}"))
    if payload.get("record_pid"):
        conn.rpush(f"test:finished_by:{ctx.job_id}", os.getpid())
    return {"items": len(results)}


@count.validator
def _(payload):
    return len(validate_items(payload))


@kind("boom")
def boom(ctx, payload):
    ctx.progress(0, total=1)
    raise ValueError(f"boom on attempt {ctx.attempt.number}")


@kind("permanent")
def permanent(ctx, payload):
    ctx.progress(0, total=1)
    raise PermanentError("the model rejected the prompt: context length exceeded")


@kind("hang")
def hang(ctx, payload):
    """Heartbeats once, then stops reporting (a hung model call)."""
    ctx.progress(0, total=1)
    time.sleep(float(payload.get("seconds", 30)))
    return {}


@kind("noop")
def noop(ctx, payload):
    return {}


@kind("dies_after_recording_failure")
def dies_after_recording_failure(ctx, payload):
    """Attempt 1 records its failure, then its work-horse is killed before RQ's bookkeeping."""
    if ctx.attempt.number == 1:
        ctx.attempt.fail("RuntimeError: recorded, then the process died", permanent=False)
        os.kill(os.getpid(), 9)
    return {"attempt": ctx.attempt.number}


@kind("breaks_at")
def breaks_at(ctx, payload):
    """Like ``count``, but raises at item ``break_at`` while the Redis key ``test:broken:<flag>``
    exists: a bug that a fix (deleting the key) then lets a replay get past."""
    conn = connect()
    broken = f"test:broken:{payload['flag']}"

    def work(item):
        index = payload["items"].index(item)
        if index == payload["break_at"] and conn.exists(broken):
            raise ConnectionError(f"model backend refused item {index} of job {ctx.job_id}")
        conn.hincrby(_calls_key(ctx.job_id), str(index), 1)
        return item.upper()

    results = ctx.for_each(payload["items"], work)
    return {"items": len(results)}


@breaks_at.validator
def _(payload):
    return len(validate_items(payload))


@kind("redis_blip")
def redis_blip(ctx, payload):
    """Attempt 1 checkpoints one item, then its Redis connection fails (as in a failover)."""
    import redis

    ctx.checkpoint(0, "first")
    if ctx.attempt.number == 1 and not ctx.connection.exists(f"test:blipped:{ctx.job_id}"):
        ctx.connection.set(f"test:blipped:{ctx.job_id}", 1)
        raise redis.exceptions.ConnectionError("Connection reset by peer")
    return {"attempt": ctx.attempt.number}


@kind("big_summary")
def big_summary(ctx, payload):
    """Returns a summary that grows with its input: the runner must refuse to store it."""
    return {"echo": payload.get("text", "") * 100}


@kind("long_error")
def long_error(ctx, payload):
    """Fails with an error far longer than the job's hash may hold, in characters that JSON
    escapes to 12 bytes each."""
    ctx.progress(0, total=1)
    raise PermanentError("\U0001F600" * 3000 + "\n" + "x" * 5000)


@kind("sleepy")
def sleepy(ctx, payload):
    """Items take ``delay`` seconds each and write nothing but their checkpoint."""
    delay = float(payload.get("delay", 0.1))
    results = ctx.for_each(payload["items"], lambda item: (time.sleep(delay), item.upper())[1])
    return {"items": len(results)}


@sleepy.validator
def _(payload):
    return len(validate_items(payload))


@kind("answers")
def answers(ctx, payload):
    """Each item upper-cased, except that an item starting with "bad" ends in an item error
    (what a built-in kind stores for an item the model could not answer) until the key
    ``test:answers:fixed`` exists; every computation is counted per item."""

    conn = connect()

    def one(item):
        conn.hincrby(_calls_key(ctx.job_id), str(payload["items"].index(item)), 1)
        if item.startswith("bad") and not conn.exists("test:answers:fixed"):
            return {"error": f"cannot answer {item.split()[0]!r}"}
        return item.upper()

    results = ctx.for_each(payload["items"], one)
    return {"items": len(results)}


@answers.validator
def _(payload):
    return len(validate_items(payload))
