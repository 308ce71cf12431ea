"""Batch mode on leash workers (real ``leash worker`` processes for deaths, deploys and a worker
free while a batch waits; the test's own process, following RQ's schedule, otherwise) against
the loopback providers' batch APIs, through the official SDKs: a batch job gives its worker back
while the provider works, stores every answer item by item, survives a SIGKILL between the create call and its record and a
deploy's SIGTERM without a second batch or a counted attempt, asks what the provider did not
answer directly, and a cancel stops the provider's batch."""

from __future__ import annotations

import os
import signal
import time

import pytest
from click.testing import CliRunner

from cli import exit_codes, main
from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from jobs.models.provider import TOKENS_PER_MESSAGE, TOKENS_PER_PROMPT
from jobs.read import job_page
from jobs.usage.meter import utc_day
from tests.conftest import wait_for
from tests.test_items_workers import ended, stored

pytestmark = pytest.mark.slow

#: How long an in-process worker goes on taking a waiting job's looks as RQ schedules them.
FOLLOW = 30

def waiting(conn, job_id) -> dict:
    return wait_for(lambda: (s := states.status(conn, job_id))["batch"] and s["batch"]["phase"] == "waiting" and s,
                    30, message=f"job {job_id} to wait at the provider")


def submit_batch(conn, prefix: str, count: int, **options) -> tuple[str, bool]:
    """A ``prompt`` job in batch mode whose items are ``<prefix>0`` ... (answered "echo: Say <item>")."""
    return enqueue(conn, "prompt", {"items": [f"{prefix}{i}" for i in range(count)], "template": "Say {item}",
                                    "mode": "batch"}, **options)


def only_batch(server):
    assert server.batches.created == 1, server.batches.created
    return next(iter(server.batches.batches))


def test_a_batch_job_succeeds_with_every_item_no_direct_call_and_one_batch(conn, burst, any_provider):
    server = any_provider
    items = [f"item {i} -> label{i % 3}" for i in range(30)]
    job_id, _ = enqueue(conn, "classify", {"items": items, "labels": ["label0", "label1", "label2"], "mode": "batch"})
    burst()
    status = waiting(conn, job_id)
    assert status["state"] == "running" and not status["stale"] and status["mode"] == "batch"
    assert status["batch"]["total"] == 30 and status["batch"]["next_look_at"]
    assert "at the provider" in status["waiting"]
    assert conn.zscore(keys.LEASES, job_id) is None  # no lease held while it waits
    server.batches.complete(only_batch(server))
    burst(follow=FOLLOW)
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert final["attempts"] == 1 and final["done"] == 30
    assert stored(conn, job_id) == {i: f"label{i % 3}" for i in range(30)}
    assert len(server.requests) == 0  # no direct call
    assert server.batches.created == 1
    assert final["batch"]["direct"] == 0
    # Right after the end, the status JSON's batch counts say what the page says.
    assert (final["batch"]["done"], final["batch"]["failed"], final["batch"]["total"]) == (30, 0, 30)
    page_batch = job_page.read(conn, job_id, "default").batch
    assert (page_batch["answered"], page_batch["total"]) == (final["batch"]["done"], final["batch"]["total"])
    assert final["usage"]["calls"] == 30
    assert [h["ended"] for h in final["history"]] == ["succeeded"]


def test_while_a_batch_job_waits_one_worker_runs_a_direct_job_to_its_end(conn, workers, batch_env):
    server = batch_env
    batch_id, _ = submit_batch(conn, "b", 20)
    workers.start()  # one `leash worker` process
    waiting(conn, batch_id)
    direct_id, _ = enqueue(conn, "prompt", {"items": [f"d{i}" for i in range(5)], "template": "Say {item}"})
    direct = ended(conn, direct_id)
    assert direct["state"] == "succeeded" and direct["done"] == 5
    during = states.status(conn, batch_id)
    assert during["state"] == "running" and during["batch"]["phase"] in ("waiting", "looking")
    assert not during["stale"]
    server.batches.complete(only_batch(server))
    final = ended(conn, batch_id)
    assert final["state"] == "succeeded" and final["done"] == 20 and final["attempts"] == 1
    assert len(server.requests) == 5  # the direct job's calls only


def _hold(server, method_name: str):
    """Make the fake provider stop inside ``method_name`` (after it acted) until released."""
    import threading

    inside, release = threading.Event(), threading.Event()
    original = getattr(server.batches, method_name)

    def held(*args, **kwargs):
        result = original(*args, **kwargs)
        if not release.is_set():
            inside.set()
            release.wait(20)
        return result

    setattr(server.batches, method_name, held)
    return inside, release


def test_a_worker_killed_between_the_create_call_and_its_record_leaves_one_batch(conn, workers, any_provider):
    server = any_provider
    created, release = _hold(server, "new")  # the batch exists at the provider; its answer is held
    job_id, _ = submit_batch(conn, "k", 10, max_attempts=3)
    first = workers.start("--no-scheduler")
    assert created.wait(30)
    horse = workers.horse(first)
    os.kill(first.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    release.set()
    assert not any(k.startswith(b"id:") for k in conn.hkeys(keys.provider_batches(job_id)))  # never recorded
    workers.start()
    waiting(conn, job_id)
    server.batches.complete(only_batch(server))
    final = ended(conn, job_id)
    assert final["state"] == "succeeded", final["error"]
    assert server.batches.created == 1 and len(server.requests) == 0
    assert final["attempts"] == 2  # the killed attempt counts; the second found its batch
    assert stored(conn, job_id) == {i: f"echo: Say k{i}" for i in range(10)}


def test_a_deploy_mid_wait_and_mid_look_counts_no_attempt(conn, workers, batch_env):
    server = batch_env
    job_id, _ = submit_batch(conn, "t", 10)
    first = workers.start()
    waiting(conn, job_id)
    first.send_signal(signal.SIGTERM)  # mid-wait: no worker holds the job
    assert first.wait(30) == 0
    assert states.status(conn, job_id)["attempts"] == 1
    looking, release = _hold(server, "polled")  # the next look stops at the provider
    second = workers.start()
    assert looking.wait(30)
    assert states.status(conn, job_id)["batch"]["phase"] == "looking"
    second.send_signal(signal.SIGTERM)  # mid-look
    release.set()
    assert second.wait(30) == 0
    status = states.status(conn, job_id)
    assert status["state"] == "running" and status["attempts"] == 1, status
    workers.start()
    server.batches.complete(only_batch(server))
    final = ended(conn, job_id)
    assert final["state"] == "succeeded" and final["attempts"] == 1
    assert [h["ended"] for h in final["history"]] == ["succeeded"]
    assert server.batches.created == 1


def test_an_expired_batch_half_done_runs_the_rest_direct_counted_apart(conn, burst, batch_env):
    server = batch_env
    job_id, _ = submit_batch(conn, "e", 20)
    burst()
    waiting(conn, job_id)
    server.batches.expire(only_batch(server), done=10)
    burst(follow=FOLLOW)
    final = ended(conn, job_id)
    assert final["state"] == "succeeded", final["error"]
    assert final["done"] == 20 and final["batch"]["direct"] == 10
    assert len(server.requests) == 10 and server.batches.created == 1
    assert stored(conn, job_id) == {i: f"echo: Say e{i}" for i in range(20)}
    assert final["usage"]["calls"] == 20


def test_cancel_of_a_waiting_job_cancels_the_providers_batch_and_ends_it_at_once(conn, burst, batch_env):
    server = batch_env
    job_id, _ = submit_batch(conn, "c", 10)
    burst()
    waiting(conn, job_id)
    started = time.monotonic()
    result = CliRunner().invoke(main, ["cancel", job_id])  # `leash cancel`
    assert result.exit_code == 0 and "canceled, and its batch at the provider too" in result.output, result.output
    status = states.status(conn, job_id)
    assert status["state"] == "failed" and status["canceled"] and time.monotonic() - started < 5
    assert server.batches.batch(only_batch(server)).canceling
    # Nothing brings it back: RQ no longer has it scheduled for a look.
    assert conn.zscore(keys.rq_scheduled("leash", conn), job_id) is None
    assert conn.hget(keys.rq_job(job_id), "status") == b"canceled"
    # Its batch's reservation is given back at once: no write of the batch will settle it.
    assert int(conn.hget(keys.job(job_id), "in_flight_tokens")) == 0
    assert conn.zcard(keys.owner_reservations(conn.hget(keys.job(job_id), "owner").decode())) == 0


def test_a_batch_reserves_its_worst_case_first_and_its_usage_is_priced_at_the_batch_multiplier(
        conn, burst, batch_env, env):
    server = batch_env
    env.setenv("LEASH_MODEL_PRICES", '{"fake-model": {"input": 1.0, "output": 2.0}}')
    env.setenv("LEASH_MODEL_MAX_TOKENS", "16")
    items = [f"p{i}" for i in range(10)]
    # Not one request's worst case (its 6 bytes, the chat template's tokens, 16 output tokens) fits.
    too_small, _ = enqueue(conn, "prompt", {"items": items, "template": "Say {item}", "mode": "batch",
                                            "budget": {"tokens": 33}})
    burst()
    refused = ended(conn, too_small)
    assert refused["state"] == "failed" and refused["error"].startswith("budget reached"), refused["error"]
    assert server.batches.created == 0  # refused before the provider was asked

    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": "Say {item}", "mode": "batch",
                                         "budget": {"tokens": 10_000}})
    burst()
    waiting(conn, job_id)
    reserved = int(conn.hget(keys.job(job_id), "in_flight_tokens"))
    # every request's worst case: its bytes, the chat template's tokens, and its max_tokens
    assert reserved == sum(len(f"Say {item}".encode()) + TOKENS_PER_MESSAGE + TOKENS_PER_PROMPT + 16 for item in items)
    owner = conn.hget(keys.job(job_id), "owner").decode()
    day_key = keys.usage_owner_day(owner, utc_day())
    assert int(conn.hget(day_key, "reserved_tokens")) == reserved
    server.batches.complete(only_batch(server))
    burst(follow=FOLLOW)
    final = ended(conn, job_id)
    assert final["state"] == "succeeded"
    # Settled by the write of its last results, on the day it was made.
    assert int(conn.hget(keys.job(job_id), "in_flight_tokens")) == 0 and int(conn.hget(day_key, "reserved_tokens")) == 0
    assert conn.zcard(keys.owner_reservations(owner)) == 0
    prompt = sum(p for p, _ in server.batches.batch_billed)
    completion = sum(c for _, c in server.batches.batch_billed)
    assert (final["usage"]["input_tokens"], final["usage"]["output_tokens"]) == (prompt, completion)
    assert final["cost_usd"] == pytest.approx((prompt * 1.0 + completion * 2.0) / 1e6 * 0.5)


def test_a_deploy_during_the_create_call_leaves_one_batch_and_counts_no_extra_attempt(conn, workers, batch_env):
    server = batch_env
    created, release = _hold(server, "new")
    job_id, _ = submit_batch(conn, "s", 10)
    first = workers.start()
    assert created.wait(30)
    first.send_signal(signal.SIGTERM)  # the deploy arrives while the provider answers the create call
    release.set()
    assert first.wait(30) == 0
    workers.start()
    waiting(conn, job_id)
    server.batches.complete(only_batch(server))
    final = ended(conn, job_id)
    assert final["state"] == "succeeded" and server.batches.created == 1
    assert final["attempts"] == 1, final["history"]


def test_a_superseded_attempt_stores_no_batch_answer_but_its_calls_are_counted(conn, env):
    from dataclasses import replace

    from jobs.core import lease
    from jobs.errors import LeaseLost
    from jobs.usage.meter import Pending

    job_id, _ = enqueue(conn, "count", {"items": ["a", "b"]})
    attempt = lease.claim(conn, job_id, "leash", "w")
    zombie = replace(attempt, token=str(int(attempt.token) - 1))
    usage = Pending("m", "count", calls=2, input=10, output=4)
    with pytest.raises(LeaseLost):
        zombie.store_items([(0, '"x"', "1,5,2"), (1, '"y"', "1,5,2")], usage)
    assert conn.hlen(keys.items(job_id)) == 0
    assert attempt.store_items([(0, '"x"', "1,5,2")], usage) is False
    assert conn.hget(keys.items(job_id), "0") == b'"x"'
    assert int(conn.hget(keys.job(job_id), "usage_calls")) == 4  # both writes' calls were paid for
    assert conn.hget(keys.usage(job_id), "i0") == b"1,5,2"


def test_a_cancel_from_a_terminal_without_the_model_settings_says_so_and_a_worker_cancels(conn, burst, batch_env):
    """The deployment decides: a `leash cancel` typed where no model is configured cannot reach
    the provider; it says so and exits 5, never "canceled at the provider", and a worker's look,
    with the deployment's settings, cancels the batch."""
    server = batch_env
    job_id, _ = submit_batch(conn, "t", 6)
    burst()
    waiting(conn, job_id)
    with pytest.MonkeyPatch.context() as terminal:
        for name in ("LEASH_MODEL_BACKEND", "LEASH_MODEL_URL", "LEASH_MODEL_NAME", "LEASH_MODEL_API_KEY"):
            terminal.delenv(name, raising=False)
        result = CliRunner().invoke(main, ["cancel", job_id])
    assert result.exit_code == exit_codes.UNREACHABLE == 5, result.output
    assert "did not confirm" in result.output and "at the provider too" not in result.output
    assert states.status(conn, job_id)["canceled"]
    assert not server.batches.batch(only_batch(server)).canceling
    burst()  # a worker's look, with the deployment's model settings
    assert server.batches.batch(only_batch(server)).canceling


def test_past_the_longest_wait_the_batch_is_canceled_and_the_items_run_direct(conn, burst, batch_env, env):
    server = batch_env
    env.setenv("LEASH_BATCH_MAX_WAIT", "3")
    env.setenv("LEASH_BATCH_CANCEL_GRACE", "0")  # the canceled batch's answers are not waited for
    job_id, _ = submit_batch(conn, "w", 8)
    burst(follow=FOLLOW)
    final = ended(conn, job_id)  # the provider never finishes
    assert final["state"] == "succeeded", final["error"]
    assert server.batches.batch(only_batch(server)).canceling
    assert final["batch"]["direct"] == 8 and len(server.requests) == 8
    # The canceled batch's reservation was given back; the direct calls' were settled.
    assert int(conn.hget(keys.job(job_id), "in_flight_tokens")) == 0
    assert conn.zcard(keys.owner_reservations(conn.hget(keys.job(job_id), "owner").decode())) == 0


def test_with_fallback_fail_requests_the_provider_did_not_answer_fail_the_job(conn, burst, batch_env, env):
    server = batch_env
    env.setenv("LEASH_BATCH_FALLBACK", "fail")
    job_id, _ = submit_batch(conn, "f", 6)
    burst()
    waiting(conn, job_id)
    server.batches.expire(only_batch(server), done=4)
    burst(follow=FOLLOW)
    final = ended(conn, job_id)
    assert final["state"] == "failed" and "2 of 6 requests were not answered" in final["error"], final["error"]
    assert final["done"] == 4 and len(server.requests) == 0  # the answered ones are kept for a replay
