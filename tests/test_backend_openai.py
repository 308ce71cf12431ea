"""Model jobs on leash workers (in the test's process, real ``leash worker`` processes for a
reschedule and for calls that outlive the lease) against a fake model server: what each kind of
server answer does to the job's state, and that partial progress survives. The tests of what an
answer means run once against each provider (``provider_server``: the OpenAI-compatible server
with the ``openai`` backend, Anthropic's with the ``anthropic`` one); the loop's own (slow and
hung calls) against the OpenAI-compatible one."""

from __future__ import annotations

import json
import time

import pytest

from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.fake_openai import API_KEY, MODEL, Error, Slow, Trickle

pytestmark = pytest.mark.slow


def status(conn, job_id):
    return states.status(conn, job_id)


def ended(conn, job_id, timeout=30):
    try:
        return wait_for(lambda: (s := status(conn, job_id))["state"] in ("succeeded", "failed") and s, timeout)
    except AssertionError:
        raise AssertionError(f"job {job_id} did not end within {timeout}s: {conn.hgetall(keys.job(job_id))}, "
                             f"RQ status {conn.hget(keys.rq_job(job_id), 'status')}, "
                             f"errors {conn.lrange(keys.errors(job_id), 0, -1)}, keys {sorted(conn.keys())}") from None


def item_results(conn, job_id) -> dict[int, object]:
    return {int(k): json.loads(v) for k, v in conn.hgetall(keys.items(job_id)).items()}


def system_prompt(body: dict) -> str:
    """The system prompt as the protocol carries it: Anthropic's top-level ``system``, or
    OpenAI's first message."""
    if "system" in body:
        assert all(m["role"] != "system" for m in body["messages"])
        return body["system"]
    first = body["messages"][0]
    assert first["role"] == "system"
    return first["content"]


def error_history(conn, job_id) -> list[dict]:
    return [json.loads(e) for e in conn.lrange(keys.errors(job_id), 0, -1)]


def test_classify_stores_the_label_the_model_chose_and_an_error_for_an_answer_outside_them(
        conn, burst, provider_server):
    items = ["great product -> positive", "it broke -> Negative.", "meh -> banana"]
    job_id, _ = enqueue(conn, "classify", {"items": items, "labels": ["positive", "negative"]})
    burst()
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert final["result"]["summary"] == {"items": 3, "labels": {"positive": 1, "negative": 1}, "errors": 1}
    results = item_results(conn, job_id)
    assert results[0] == "positive" and results[1] == "negative"
    assert "banana" in results[2]["error"] and "neither is one of the labels" in results[2]["error"]
    # The answer outside the labels was sent back once with a correction, then recorded.
    third = provider_server.seen(items[2])
    assert len(third) == 2
    assert "'banana' is not one of the labels" in third[1].last
    first = provider_server.seen(items[0])[0]
    assert first.body["model"] == MODEL
    assert first.api_key == API_KEY
    assert "- positive\n- negative" in system_prompt(first.body)


def test_prompt_stores_each_completion(conn, burst, provider_server):
    job_id, _ = enqueue(conn, "prompt", {"items": ["cats", "{dogs}"], "template": 'Summarise {item} as {"json": 1}'})
    burst()
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert item_results(conn, job_id) == {0: 'echo: Summarise cats as {"json": 1}',
                                          1: 'echo: Summarise {dogs} as {"json": 1}'}
    assert final["result"]["summary"]["items"] == 2 and final["result"]["summary"]["errors"] == 0


def test_429_with_a_short_retry_after_waits_in_place_and_the_job_goes_on(conn, burst, provider_server):
    provider_server.on("b", Error(429, "Rate limit reached", headers={"Retry-After": "2"}))
    job_id, _ = enqueue(conn, "prompt", {"items": ["a", "b", "c"], "template": "{item}"})
    burst()
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert final["attempts"] == 1
    refused, answered = provider_server.seen("b")
    waited = answered.at - refused.at
    print(f"429 Retry-After 2 s: the retry came {waited:.2f} s later")
    assert 2.0 <= waited < 4.0
    assert len(provider_server.seen("a")) == 1 and len(provider_server.seen("c")) == 1
    assert error_history(conn, job_id) == []


def test_429_with_a_long_retry_after_reschedules_the_job_without_counting_an_attempt(conn, workers, provider_server):
    provider_server.on("b", Error(429, "Rate limit reached", headers={"retry-after-ms": "3000"}))
    job_id, _ = enqueue(conn, "prompt", {"items": ["a", "b", "c"], "template": "{item}"})
    workers.start(extra_env={"LEASH_MODEL_MAX_INLINE_WAIT": "1"})
    final = ended(conn, job_id, timeout=40)

    assert final["state"] == "succeeded", final["error"]
    assert final["attempts"] == 1  # the deferral did not burn an attempt
    assert int(conn.hget(keys.job(job_id), "defers")) == 1
    refused, answered = provider_server.seen("b")
    waited = answered.at - refused.at
    print(f"429 retry-after-ms 3000 (inline bound 1 s): rescheduled, the retry came {waited:.2f} s later")
    assert 3.0 <= waited < 8.0
    assert len(provider_server.seen("a")) == 1, "the rescheduled job started over instead of resuming"


def test_a_500_is_sent_again_in_place_and_the_job_goes_on(conn, burst, provider_server):
    provider_server.on("b", Error(500, "upstream exploded"))
    job_id, _ = enqueue(conn, "prompt", {"items": ["a", "b", "c"], "template": "{item}"}, max_attempts=3)
    burst()
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert final["attempts"] == 1 and error_history(conn, job_id) == []
    refused, answered = provider_server.seen("b")
    assert answered.at - refused.at >= 1.0  # sent again after a second
    assert [len(provider_server.seen(x)) for x in "ac"] == [1, 1]


def test_400_context_length_fails_at_once_with_the_servers_message(conn, burst, provider_server):
    message = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9001 tokens."
    provider_server.on("b", Error(400, message, code="context_length_exceeded"))
    job_id, _ = enqueue(conn, "prompt", {"items": ["a", "b", "c"], "template": "{item}"}, max_attempts=3)
    burst()
    final = ended(conn, job_id)

    assert final["state"] == "failed"
    assert final["attempts"] == 1
    assert message in final["error"] and "shorten the items" in final["error"]
    assert len(provider_server.seen("b")) == 1
    results = item_results(conn, job_id)
    assert results[0] == "echo: a" and 1 not in results  # the done item is kept
    # "c" ran beside "b" (items run concurrently): its call finished and was stored, not lost.
    assert results.get(2) == ("echo: c" if provider_server.seen("c") else None)


def test_a_slow_call_longer_than_the_lease_is_not_reclaimed(conn, workers, model_server):
    model_server.on("slow", Slow(6))  # the lease is 2 s
    job_id, _ = enqueue(conn, "prompt", {"items": ["slow"], "template": "{item}"}, max_attempts=3)
    workers.start()
    wait_for(lambda: model_server.seen("slow"), 20, message="the slow call to arrive")

    samples = []

    def finished():
        s = status(conn, job_id)
        if s["state"] == "running":
            samples.append(s["stale"])
            return None
        return s

    final = wait_for(finished, 30, interval=0.1, message="the slow job to end")

    assert final["state"] == "succeeded", final["error"]
    assert final["attempts"] == 1
    assert len(model_server.seen("slow")) == 1
    assert int(conn.get(keys.RECLAIMS) or 0) == 0
    assert samples and not any(samples), "the job looked stale while its call was alive"


def test_a_call_hung_past_its_timeout_is_reclaimed(conn, workers, model_server, env):
    env.setenv("LEASH_MODEL_TIMEOUT", "2")  # the keepalive gives up after 2 + 2 (connect) + 1 s
    model_server.on("hang", Trickle())
    job_id, _ = enqueue(conn, "prompt", {"items": ["hang"], "template": "{item}"}, max_attempts=1)
    workers.start()
    [call] = wait_for(lambda: model_server.seen("hang"), 20, message="the hung call to arrive")

    # Past the 2 s lease but inside the call's timeout: kept alive.
    wait_for(lambda: time.time() > call.at + 3.5, 10)
    assert status(conn, job_id)["state"] == "running" and not status(conn, job_id)["stale"]

    final = ended(conn, job_id, timeout=20)
    failed_at = float(conn.hget(keys.job(job_id), "ended_at"))
    print(f"hung call reclaimed {failed_at - call.at:.2f} s after it started (timeout 2 s, lease 2 s)")
    assert final["state"] == "failed"
    assert final["error"].startswith("lease expired")
    assert 5.0 <= failed_at - call.at <= 5.0 + 2.0 + 3.0
    assert int(conn.get(keys.RECLAIMS)) == 1
