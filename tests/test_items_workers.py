"""Items many at once on leash workers (in the test's process; real ``leash worker`` processes
for the deploy and the SIGKILL) against the fake OpenAI-compatible server with a set latency: calls overlap up to the limit, a deploy mid-batch redoes nothing, a
SIGKILL redoes at most the calls in flight, and a server that takes only a few calls at once
brings every job's concurrency down to it."""

from __future__ import annotations

import json
import os
import signal

import pytest

from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.fake_openai import MODEL
from tests.test_web_metrics import samples
from tests.web_support import create_app_with

pytestmark = pytest.mark.slow


def ended(conn, job_id, timeout=60):
    return wait_for(lambda: (s := states.status(conn, job_id))["state"] in ("succeeded", "failed") and s, timeout,
                    message=f"job {job_id} to end")


def stored(conn, job_id) -> dict[int, str]:
    return {int(k): json.loads(v) for k, v in conn.hgetall(keys.items(job_id)).items()}


def calls_per_item(server) -> dict[str, int]:
    counts: dict[str, int] = {}
    for seen in list(server.requests):
        counts[seen.item] = counts.get(seen.item, 0) + 1
    return counts


def test_a_job_runs_its_calls_concurrently_up_to_the_limit(conn, burst, model_server, env):
    model_server.latency = 0.3
    env.setenv("LEASH_ITEM_CONCURRENCY", "6")
    items = [f"item-{i}" for i in range(24)]
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": "{item}"})
    burst()
    final = ended(conn, job_id)
    assert final["state"] == "succeeded", final["error"]
    assert final["done"] == 24 and stored(conn, job_id) == {i: f"echo: item-{i}" for i in range(24)}
    # 24 calls of 0.3 s, 6 at a time: 4 rounds, not 24.
    started_at, ended_at = conn.hmget(keys.job(job_id), "started_at", "ended_at")
    assert float(ended_at) - float(started_at) < 24 * 0.3 / 2
    assert model_server.max_in_flight == 6


def test_a_job_that_asks_for_fewer_calls_at_once_gets_them(conn, burst, model_server, env):
    model_server.latency = 0.2
    env.setenv("LEASH_ITEM_CONCURRENCY", "8")
    job_id, _ = enqueue(conn, "prompt", {"items": [f"i{n}" for n in range(8)], "template": "{item}",
                                         "item_concurrency": 2})
    burst()
    assert ended(conn, job_id)["state"] == "succeeded"
    assert model_server.max_in_flight == 2


def test_a_deploy_mid_batch_stores_the_calls_in_flight_and_the_next_worker_redoes_none(conn, workers,
                                                                                      model_server, env):
    model_server.latency = 0.5
    env.setenv("LEASH_ITEM_CONCURRENCY", "4")
    items = [f"item-{i}" for i in range(40)]
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": "{item}"})
    first = workers.start("--no-scheduler")
    wait_for(lambda: states.status(conn, job_id)["done"] >= 8, 30, message="progress on the first worker")
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=20)
    handed_off = states.status(conn, job_id)
    assert handed_off["state"] == "queued" and handed_off["attempts"] == 0  # a deploy costs no attempt
    workers.start("--no-scheduler")
    final = ended(conn, job_id)
    assert final["state"] == "succeeded" and final["done"] == 40
    assert calls_per_item(model_server) == {item: 1 for item in items}, "a call was made twice"


def test_sigkill_mid_batch_redoes_at_most_the_calls_in_flight(conn, workers, model_server, env):
    model_server.latency = 0.5
    env.setenv("LEASH_ITEM_CONCURRENCY", "8")
    items = [f"item-{i}" for i in range(64)]
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": "{item}"}, max_attempts=3)
    first = workers.start("--no-scheduler")
    wait_for(lambda: states.status(conn, job_id)["done"] >= 16, 30, message="progress on the first worker")
    horse = workers.horse(first)
    os.kill(first.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    stored_at_kill = set(stored(conn, job_id))
    asked_before_kill = len(model_server.requests)
    workers.start("--no-scheduler")
    final = ended(conn, job_id)

    assert final["state"] == "succeeded" and final["done"] == 64 and final["attempts"] == 2
    assert stored(conn, job_id) == {i: f"echo: item-{i}" for i in range(64)}
    # A connection the killed work-horse cut before its body arrived reaches the server as an
    # empty request (no item): it asked nothing.
    asked_again = [s.item for s in model_server.requests[asked_before_kill:] if s.item]
    assert not {items.index(item) for item in asked_again} & stored_at_kill, "a stored item was asked again"
    redone = sum(count - 1 for count in calls_per_item(model_server).values())
    print(f"SIGKILL at concurrency 8: {redone} calls redone")
    assert redone <= 8


def test_a_server_that_takes_few_calls_at_once_brings_the_shared_limit_down_to_it(conn, burst, model_server,
                                                                                   env):
    model_server.latency = 0.2
    model_server.capacity = 3
    model_server.retry_after = "0"
    env.setenv("LEASH_ITEM_CONCURRENCY", "12")
    items = [f"item-{i}" for i in range(60)]
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": "{item}"})
    burst()
    final = ended(conn, job_id, timeout=90)

    assert final["state"] == "succeeded" and final["done"] == 60
    answered = len(model_server.requests)
    print(f"server capacity 3, concurrency 12: {model_server.rate_limited} 429s for {answered} answers")
    assert model_server.rate_limited < 0.25 * answered
    limit = int(conn.hget(keys.model_concurrency(MODEL), "limit"))
    assert 1 <= limit <= 4
    metrics = samples(create_app_with().test_client().get("/metrics"))
    model = (("model", MODEL),)
    assert metrics[("leash_model_concurrency", model)] == limit
    assert metrics[("leash_model_429s_total", model)] == model_server.rate_limited
    assert metrics[("leash_model_answers_total", model)] == answered
