"""Money on leash workers (real ``leash worker`` processes where a SIGKILL or a worker that stays
up is tested, the test's own process otherwise) against the fake OpenAI-compatible server: a job's
usage is the sum of what the server billed, SIGKILL included; a budget stops a job before it
passes the line and a replay with a larger one finishes it without asking a stored item again;
an owner's daily budget stops its running jobs."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.fake_openai import Reply
from tests.test_items_workers import calls_per_item, ended, stored

pytestmark = pytest.mark.slow


def billed(server) -> tuple[int, int, int]:
    """(calls, prompt tokens, completion tokens) of every answer the server delivered."""
    with server.lock:
        return len(server.billed), sum(p for p, _ in server.billed), sum(c for _, c in server.billed)


def counted(fields) -> tuple[int, int, int]:
    usage = fields["usage"]
    return usage["calls"], usage["input_tokens"], usage["output_tokens"]


def wait_gone(worker, horse: int) -> None:
    """The killed worker and its work-horse are gone (a zombie's sockets are closed): a call
    held at the server finds its client gone."""
    worker.wait(timeout=30)
    wait_for(lambda: not psutil.pid_exists(horse) or psutil.Process(horse).status() == psutil.STATUS_ZOMBIE, 30,
             message="the work-horse gone")


def test_a_jobs_usage_is_what_the_server_billed_including_calls_redone_after_a_sigkill(
        conn, workers, model_server, env):
    """The calls in flight when the worker is SIGKILLed are billed by the provider (it finishes
    them for no one) and counted, as estimated calls, before the job reads succeeded -- not when
    their reservations' deadlines pass minutes later."""
    model_server.latency = 0.2
    model_server.bills_abandoned = True
    env.setenv("LEASH_ITEM_CONCURRENCY", "4")
    env.setenv("LEASH_MODEL_PRICES", '{"fake-model": {"input": 1.0, "output": 2.0}}')
    items = [f"item-{i} " + "word " * (i % 7) for i in range(40)]
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": "Say it back: {item}"}, max_attempts=3)
    model_server.hold_after(12)  # 12 answers, then the calls in flight wait at the server
    first = workers.start("--no-scheduler")
    wait_for(lambda: states.status(conn, job_id)["done"] == 12, 30, message="12 items stored")
    wait_for(lambda: len(model_server.requests) >= 12 + 4, 10, message="4 calls held in flight")
    horse = workers.horse(first)
    os.kill(first.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    wait_gone(first, horse)
    model_server.release()  # the held calls find their client gone: billed all the same
    wait_for(lambda: billed(model_server)[0] == len(model_server.requests) >= 16, 30,
             message="the calls held at the kill billed")
    workers.start("--no-scheduler")
    final = ended(conn, job_id)

    assert final["state"] == "succeeded" and final["attempts"] == 2
    calls, prompt, completion = billed(model_server)
    usage = final["usage"]
    print(f"usage after a SIGKILL: {calls} calls billed, {usage['calls']} counted "
          f"({usage['estimated_calls']} estimated); tokens billed {prompt + completion:,}, counted "
          f"{usage['input_tokens'] + usage['output_tokens']:,}")
    redone = sum(n - 1 for n in calls_per_item(model_server).values())
    assert calls == 40 + redone and 4 <= redone <= 8  # the calls in flight at the kill, asked again
    # Every call billed is counted; one admitted but not yet sent at the kill is counted as an estimate too.
    assert calls <= usage["calls"] <= calls + 4 and usage["estimated_calls"] >= 4
    assert (usage["input_tokens"] + usage["output_tokens"]) == pytest.approx(prompt + completion, rel=0.15)


def test_a_budget_stops_the_job_before_it_passes_and_a_replay_with_more_finishes_it(
        conn, workers, model_server, env):
    """A 200-item job at concurrency 8 with a budget of 50 calls' tokens stops after at most 58
    calls; replayed with a larger budget it finishes, with at most 8 calls made twice."""
    model_server.latency = 0.05
    env.setenv("LEASH_ITEM_CONCURRENCY", "8")
    env.setenv("LEASH_MODEL_MAX_TOKENS", "8")  # answers of ~6 tokens: the worst case is close to the truth
    items = [f"item {i:03d}" for i in range(200)]
    template = "Repeat: {item}"
    model_server.answer = lambda item: "ok " + item[-3:]
    # One call: prompt ~ len("Repeat: item 000") / 4 + 1 = 5 tokens, answer 2 tokens.
    one_call = (len("Repeat: item 000") // 4 + 1) + (len("ok 000") // 4 + 1)
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": template,
                                         "budget": {"tokens": 50 * one_call}})
    worker = workers.start()
    final = ended(conn, job_id)

    assert final["state"] == "failed" and final["error"].startswith("budget reached"), final["error"]
    assert f"{50 * one_call:,} tokens" in final["error"]
    calls_made = len(model_server.requests)
    spent = final["usage"]["input_tokens"] + final["usage"]["output_tokens"]
    print(f"budget of {50 * one_call} tokens (50 calls): stopped after {calls_made} calls, {spent} tokens, "
          f"{final['done']} items stored")
    assert calls_made <= 58 and spent <= 50 * one_call
    assert final["done"] == calls_made  # what was in flight was stored

    from click.testing import CliRunner

    from cli import main

    replay = CliRunner().invoke(main, ["replay", "--budget-tokens", str(300 * one_call), "--", job_id])
    assert replay.exit_code == 0, replay.output
    final = wait_for(lambda: (s := states.status(conn, job_id))["state"] in ("succeeded", "failed")
                     and s["attempts"] >= 1 and s["done"] == 200 and s, 60, message="the replay to finish")
    assert final["state"] == "succeeded" and final["budget"] == {"tokens": 300 * one_call}
    twice = sum(1 for n in calls_per_item(model_server).values() if n > 1)
    print(f"replayed with {300 * one_call} tokens: {len(model_server.requests)} calls in all, {twice} items asked twice")
    assert twice <= 8 and len(stored(conn, job_id)) == 200
    assert counted(final) == billed(model_server)
    assert worker.poll() is None


def test_an_owners_daily_budget_stops_its_running_job_with_an_error_naming_it(conn, burst, model_server, env):
    model_server.latency = 0.05
    env.setenv("LEASH_ITEM_CONCURRENCY", "2")
    env.setenv("LEASH_OWNER_DAILY_TOKENS", "120")
    env.setenv("LEASH_MODEL_MAX_TOKENS", "8")
    job_id, _ = enqueue(conn, "prompt", {"items": [f"item {i}" for i in range(100)], "template": "{item}"},
                        owner="carol")
    burst()
    final = ended(conn, job_id)
    assert final["state"] == "failed" and final["error"].startswith("budget reached: owner 'carol'")
    assert "LEASH_OWNER_DAILY_TOKENS" in final["error"]
    assert final["usage"]["input_tokens"] + final["usage"]["output_tokens"] <= 120
    assert final["done"] == final["usage"]["calls"] >= 5  # it ran until the line, then stopped
    assert conn.ttl(keys.usage(job_id)) > 0


def test_calls_thrown_away_are_counted_and_a_server_silent_on_usage_is_estimated(conn, burst, model_server, env):
    """A classify answer outside the labels (asked again), an answer cut off at max_tokens and
    a server that reports no usage: every call counted, the estimate marked as one."""
    items = ["odd -> banana", "fine -> yes", "silent -> no"]
    model_server.on("silent -> no", Reply(report_usage=False))
    model_server.on("odd -> banana", Reply("banana"), times=2)
    job_id, _ = enqueue(conn, "classify", {"items": items, "labels": ["yes", "no"]})
    burst()
    final = ended(conn, job_id)
    assert final["state"] == "succeeded" and final["result"]["summary"]["errors"] == 1
    calls, prompt, completion = billed(model_server)
    assert calls == 3  # banana twice, fine once; the silent server billed nothing it reported
    assert final["usage"]["calls"] == 4 and final["usage"]["estimated"] is True
    assert final["usage"]["input_tokens"] > prompt and final["usage"]["output_tokens"] > completion
    assert conn.hget(keys.usage(job_id), "i0").startswith(b"2,")  # the item's two calls, with it


def test_an_answer_cut_off_at_max_tokens_is_stored_as_that_items_error_and_still_counted(
        conn, burst, model_server, env):
    model_server.on("long", Reply("a very long answer", finish_reason="length"))
    job_id, _ = enqueue(conn, "prompt", {"items": ["long", "short"], "template": "{item}"})
    burst()
    final = ended(conn, job_id)
    assert final["state"] == "succeeded" and final["result"]["summary"]["errors"] == 1
    assert final["usage"]["calls"] == 2 and counted(final) == billed(model_server)
    assert conn.hget(keys.usage(job_id), "i0").startswith(b"1,")
