"""Every answer leash received is counted exactly once, whatever Redis does next: a real worker
whose calls are answered while Redis is away (45 s, the lease 10 s) keeps what it was paid for
until Redis is back, the next attempt uses those answers instead of asking again, and usage is
what the stand-in provider billed. The longer outage, where the calls' reservations expire
before the answers reach Redis, is written as expired state: the abandoned calls are counted as
estimates, and the real usage replaces the estimates when it arrives."""

from __future__ import annotations

import json
import os
import time

import pytest
import redis

from jobs import keys
from jobs.core import lease, states
from jobs.core.running.context import JobContext
from jobs.enqueue import enqueue
from jobs.usage import budget
from jobs.usage.meter import Pending, flush
from tests.conftest import wait_for
from tests.test_items_workers import calls_per_item
from tests.test_redis_outage import own_redis  # noqa: F401  (a Redis of the test's own, restartable)
from tests.test_usage_workers import billed, counted

#: 45 s in the suite; LEASH_TEST_OUTAGE_SECONDS=300 for the 5-minute outage (docs/MODELS.md's figures).
OUTAGE_SECONDS = float(os.environ.get("LEASH_TEST_OUTAGE_SECONDS", "45"))


@pytest.mark.slow
def test_answers_received_while_redis_is_away_are_counted_once_and_never_asked_again(
        own_redis,  # noqa: F811
        workers, model_server, env, tmp_path):
    env.setenv("LEASH_LEASE_SECONDS", "10")
    env.setenv("LEASH_ITEM_CONCURRENCY", "8")
    client = redis.Redis.from_url(own_redis.url)
    items = [f"paid item {i}" for i in range(8)]
    job_id, _ = enqueue(client, "prompt", {"items": items, "template": "Say {item}"})
    model_server.hold_after(0)  # every call waits at the provider until Redis is gone
    workers.start()
    wait_for(lambda: len(model_server.requests) == 8, 30, message="8 calls in flight")
    client.close()
    own_redis.stop()
    model_server.release()  # answered (and billed) while Redis is away
    wait_for(lambda: len(model_server.billed) == 8, 10, message="8 answers delivered")
    gone_at = time.monotonic()
    while time.monotonic() - gone_at < OUTAGE_SECONDS:
        time.sleep(0.5)  # the outage itself: nothing to poll for while Redis is down
    own_redis.start()
    client = redis.Redis.from_url(own_redis.url)
    final = wait_for(lambda: (s := states.status(client, job_id))["state"] in ("succeeded", "failed") and s, 120,
                     interval=0.2, message="the job to end after the outage")
    calls, prompt, completion = billed(model_server)
    asked_twice = sum(1 for n in calls_per_item(model_server).values() if n > 1)
    print(f"{OUTAGE_SECONDS:g} s outage, lease 10 s: {calls} answers billed, {final['usage']['calls']} counted "
          f"({final['usage'].get('estimated_calls', 0)} estimated), {asked_twice} items asked twice, "
          f"{final['attempts']} attempt(s)")
    assert final["state"] == "succeeded", final["error"]
    assert asked_twice == 0 and calls == 8
    assert counted(final) == (calls, prompt, completion)
    assert final["usage"].get("estimated_calls", 0) == 0
    client.close()


def _claimed(conn, owner="olga"):
    job_id, _ = enqueue(conn, "prompt", {"items": ["x"], "template": "{item}"}, owner=owner)
    return job_id, lease.claim(conn, job_id, "leash", "w1")


def _admit(conn, attempt, now, reservation=None, worst=1000, call=None):
    return budget.admit(conn, ["leash:test:rq", "leash:test:rt", "leash:test:rp"], 0, 0, 10**9, attempt, worst,
                        None, now=now, daily_limits=(0, 0), reservation=reservation, hold=100,
                        call=call or budget.CallEstimate("m1", 40, 0, 960))


def test_a_call_whose_reservation_expires_unsettled_is_counted_as_an_estimate(conn, env):
    """Its work-horse was killed: the call was probably paid for. The owner's next admission
    (or the reaper's sweep) counts it -- its input, and the job's average answer -- marked
    estimated, on the job, the owner's day and the model."""
    job_id, attempt = _claimed(conn)
    now = time.time()
    abandoned = _admit(conn, attempt, now)
    assert abandoned.code == budget.ADMITTED
    assert budget.sweep_reservations(conn, now + 50) == 0  # before its deadline: it may still be answered
    assert budget.sweep_reservations(conn, now + 101) == 1
    job = states.status(conn, job_id)
    assert job["usage"]["calls"] == 1 and job["usage"]["estimated_calls"] == 1
    assert job["usage"]["input_tokens"] == 40 and job["usage"]["output_tokens"] == 960  # no answer seen: worst
    day = conn.hgetall(keys.usage_owner_day("olga", abandoned.day))
    assert int(day[b"estimated_calls"]) == 1 and int(day[b"input_tokens"]) == 40
    assert int(conn.hget(keys.usage_model("m1"), b"calls")) == 1
    assert int(conn.hget(keys.job(job_id), "in_flight_tokens")) == 0
    # Its tombstone (for a late real write) is the owner's only entry left: swept a day later.
    assert conn.zscore(keys.reservation_owners(), "olga") >= now + 101 + 86400


def test_the_real_usage_of_a_call_counted_as_abandoned_replaces_the_estimate(conn, env):
    """A worker that held its answer through a long outage writes it after the reservation's
    deadline passed and the call was counted as an estimate: the figures become the real ones,
    counted once."""
    job_id, attempt = _claimed(conn)
    now = time.time()
    admitted = _admit(conn, attempt, now)
    _admit(conn, attempt, now + 101, worst=10)  # the next admission finds it expired: an estimate
    assert states.status(conn, job_id)["usage"]["estimated_calls"] == 1
    late = Pending("m1", "prompt", calls=1, input=35, output=7, day=admitted.day, reservations=[admitted.reservation])
    flush(attempt, [late])
    late.write_id = ""  # a fresh write: sent again it would count once (add_usage_once)
    job = states.status(conn, job_id)
    assert (job["usage"]["calls"], job["usage"]["input_tokens"], job["usage"]["output_tokens"]) == (1, 35, 7)
    assert job["usage"]["estimated_calls"] == 0
    day = conn.hgetall(keys.usage_owner_day("olga", admitted.day))
    assert (int(day[b"calls"]), int(day[b"input_tokens"]), int(day.get(b"estimated_calls", 0))) == (1, 35, 0)
    assert int(conn.hget(keys.usage_model("m1"), b"input_tokens")) == 35


def test_answers_an_attempt_could_not_store_are_used_by_the_next_without_a_call(conn, env, model_server):
    job_id, attempt = _claimed(conn)
    from jobs.models.openai_backend import OpenAIBackend

    ctx = JobContext(attempt, {})
    first = OpenAIBackend(ctx)
    assert first.complete("hello there") == "echo: hello there"
    kept = ctx.meter.take()
    ctx.meter.keep(kept)  # its item write did not land
    ctx.flush_usage(all_threads=True)
    stored = conn.hgetall(keys.received_answers(job_id))
    assert len(stored) == 1 and json.loads(next(iter(stored.values())))["text"] == "echo: hello there"
    assert states.status(conn, job_id)["usage"]["calls"] == 1

    conn.hset(keys.job(job_id), "state", "queued")
    second = OpenAIBackend(JobContext(lease.claim(conn, job_id, "leash", "w2"), {}))
    assert second.complete("hello there") == "echo: hello there"
    assert len(model_server.requests) == 1  # answered from what was kept: not asked, not paid again
    assert second.complete("something else") == "echo: something else"
    assert len(model_server.requests) == 2


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "deploy past the grace"])
def test_calls_cut_by_a_killed_work_horse_are_counted_as_estimates(conn, workers, model_server, env, how):
    """8 answers stored, 4 calls in flight when the work-horse dies (SIGKILL, or a deploy whose
    calls outlast LEASH_HANDOFF_GRACE): before the job reads succeeded, the attempt that ends it
    counts each as an estimated call (the job's average answer), marked estimated -- not when
    their reservations' deadlines pass minutes later (the reaper's sweep then finds none)."""
    import signal

    from tests.test_items_workers import ended

    env.setenv("LEASH_ITEM_CONCURRENCY", "4")
    env.setenv("LEASH_HANDOFF_GRACE", "1")
    job_id, _ = enqueue(conn, "prompt", {"items": [f"item {i}" for i in range(20)], "template": "{item}"})
    model_server.hold_after(8)
    first = workers.start("--no-scheduler")
    wait_for(lambda: states.status(conn, job_id)["done"] == 8, 30, message="8 items stored")
    wait_for(lambda: len(model_server.requests) >= 12, 10, message="4 calls held in flight")
    horse = workers.horse(first)
    if how == "SIGKILL":
        os.kill(first.pid, signal.SIGKILL)
        os.kill(horse, signal.SIGKILL)
    else:
        os.kill(first.pid, signal.SIGTERM)
        wait_for(lambda: first.poll() is not None, 30, message="the worker to stop after its grace")
    model_server.bills_abandoned = True
    model_server.release()  # the held calls are billed for no one: leash never learns what they cost
    workers.start("--no-scheduler")
    final = ended(conn, job_id)
    usage = final["usage"]
    assert final["state"] == "succeeded" and usage["estimated_calls"] == 4 and usage["estimated"]
    abandoned = budget.sweep_reservations(conn, time.time() + 3600)  # their deadlines, passed
    after = states.status(conn, job_id)["usage"]
    print(f"{how}: {usage['calls'] - 4} calls answered and {usage['estimated_calls']} abandoned ones counted "
          f"as the job ended; {abandoned} left for the sweep")
    assert abandoned == 0 and after == usage
    assert usage["calls"] == 20 + 4 == len(model_server.billed)
