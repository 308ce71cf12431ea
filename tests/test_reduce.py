"""The ``reduce`` kind: many texts, one answer, map-reduce in chunks under
LEASH_REDUCE_CHUNK_TOKENS, each call checkpointed (jobs/core/running/chunk_tree.py). The packing
and the offline backend's answer as units; a reduce of many chunks on a worker in the test's
process (the offline backend, then the stand-in provider: a re-run is answered by the request
cache, a token budget stops it); a SIGKILLed worker's reduce resumed by another without asking a
finished chunk again (real ``leash worker`` processes)."""

from __future__ import annotations

import os
import signal

import pytest
from click.testing import CliRunner

from cli import main
from jobs import keys
from jobs.core import states
from jobs.core.running import chunk_tree
from jobs.enqueue import enqueue
from jobs.intake.estimate import estimate_reduce
from jobs.intake.submission import dry_run
from jobs.models.backends import LocalBackend
from jobs.models.provider import estimate_text_tokens
from jobs.read import results
from tests.conftest import wait_for
from tests.test_items_workers import ended, stored
from tests.test_usage_workers import billed

INSTRUCTION = "Summarise the complaints"
WORDS = ["kettle leaks water", "handle broke", "arrived late and damaged", "lid does not close",
         "too loud when boiling"]
REVIEWS = [f"review {n}: the {WORDS[n % len(WORDS)]}" for n in range(100)]


def measure_words(text: str) -> int:
    return len(text.split())


def test_packing_keeps_the_order_and_the_bound():
    texts = ["a b", "c d e", "f", "g h i j", "k"]
    chunks = chunk_tree.pack(texts, 5, measure_words)
    assert chunks == [["a b", "c d e"], ["f", "g h i j"], ["k"]]
    assert [t for chunk in chunks for t in chunk] == texts
    assert all(sum(map(measure_words, chunk)) <= 5 for chunk in chunks)


def test_a_text_over_the_bound_is_a_chunk_alone_and_nothing_is_one_chunk():
    assert chunk_tree.pack(["a", "b c d e f g", "h"], 3, measure_words) == [["a"], ["b c d e f g"], ["h"]]
    assert chunk_tree.pack([], 3, measure_words) == [[]]
    assert chunk_tree.pack(["a", "b"], 3, measure_words) == [["a", "b"]]


def test_a_digest_tells_chunks_apart():
    assert chunk_tree.digest(["ab", "c"]) != chunk_tree.digest(["a", "bc"])
    assert chunk_tree.digest(["ab", "c"]) == chunk_tree.digest(["ab", "c"])


def test_the_offline_backends_answer_is_the_same_whatever_the_chunks():
    local = LocalBackend(delay_ms=0)
    whole = local.reduce(INSTRUCTION, REVIEWS)
    assert whole.startswith("[local] 100 inputs; frequent words: review (100)") and INSTRUCTION in whole
    parts = [local.reduce(INSTRUCTION, REVIEWS[n:n + 30], partial=True) for n in range(0, 100, 30)]
    assert parts[0].startswith("[local] 30 inputs") and INSTRUCTION not in parts[0]
    halves = [local.reduce(INSTRUCTION, parts[:2], partial=True), local.reduce(INSTRUCTION, parts[2:], partial=True)]
    assert local.reduce(INSTRUCTION, halves) == whole


def test_a_reduce_of_many_chunks_answers_once_and_shows_one_result(conn, burst, env):
    env.setenv("LEASH_REDUCE_CHUNK_TOKENS", "100")
    job_id, _ = enqueue(conn, "reduce", {"items": REVIEWS, "instruction": INSTRUCTION})
    burst()
    final = ended(conn, job_id)
    kept = stored(conn, job_id)
    answer = kept[0]
    partials = {index: value for index, value in kept.items() if index < 0}
    first_level = chunk_tree.pack(REVIEWS, 100, estimate_text_tokens)
    assert final["state"] == "succeeded", final["error"]
    assert answer == LocalBackend(delay_ms=0).reduce(INSTRUCTION, REVIEWS)  # the same as one call's
    assert len(first_level) > 2 and len(partials) > len(first_level)  # more than one level of partials
    assert sorted(partials) == list(range(-len(partials), 0))
    assert final["done"] == final["total"] == len(partials) + 1  # progress in calls
    assert final["result"]["summary"] == {"items": 100, "characters": len(answer)}
    rows = list(results.iter_results(conn, job_id))
    assert rows == [(0, INSTRUCTION, answer, None)]  # one row: the instruction, the answer
    page = results.read_page(conn, job_id)
    assert page.items == [(0, answer)] and (page.done, page.total) == (1, 1)
    shown = CliRunner().invoke(main, ["status", job_id])
    assert f"{final['total']} of {final['total']} model calls (100%)" in shown.output, shown.output


def test_a_reduce_that_fits_one_call_makes_one(conn, burst):
    job_id, _ = enqueue(conn, "reduce", {"items": REVIEWS[:5], "instruction": INSTRUCTION})
    burst()
    final = ended(conn, job_id)
    assert final["state"] == "succeeded" and list(stored(conn, job_id)) == [0]
    assert final["done"] == final["total"] == 1


def test_a_reduce_takes_another_jobs_results(conn, burst):
    source, _ = enqueue(conn, "prompt", {"items": REVIEWS[:20], "template": "Complaint: {item}"})
    job_id, _ = enqueue(conn, "reduce", {"items_from": {"job": source, "results": True}, "instruction": INSTRUCTION})
    burst()
    assert ended(conn, job_id)["state"] == "succeeded"
    completions = [result for _, _, result, _ in results.iter_results(conn, source)]
    assert results.submitted_items(conn, job_id) == completions
    assert stored(conn, job_id)[0].startswith("[local] 20 inputs")


def test_a_reduce_of_no_items_makes_no_call_and_has_no_answer(conn, burst):
    source, _ = enqueue(conn, "classify", {"items": ["good film", "great cast"], "labels": ["positive", "negative"]})
    job_id, _ = enqueue(conn, "reduce", {"items_from": {"job": source, "label": "negative", "results": True},
                                         "instruction": INSTRUCTION})
    burst()
    final = ended(conn, job_id)
    assert final["state"] == "succeeded" and final["result"]["summary"] == {"items": 0, "characters": 0}
    assert stored(conn, job_id) == {} and list(results.iter_results(conn, job_id)) == [(0, INSTRUCTION, None, None)]


@pytest.mark.parametrize("payload, message", [
    ({"items": ["a"]}, "'instruction' must be a non-empty string"),
    ({"items": ["a"], "instruction": "  "}, "'instruction' must be a non-empty string"),
    ({"items": ["a"], "instruction": "x", "template": "{item}"}, "unknown field 'template'"),
])
def test_a_reduce_is_checked_at_the_door(conn, payload, message):
    from jobs.errors import InvalidJob

    with pytest.raises(InvalidJob, match=message):
        enqueue(conn, "reduce", payload)


def short_answers(server) -> None:
    """The stand-in provider answers a reduce call briefly, the same for the same texts."""
    server.answer = lambda listing: f"summary of {listing.count(chr(10) + chr(10)) + 1} texts, {len(listing)} chars"


def test_a_rerun_is_answered_from_the_request_cache_with_no_call(conn, burst, model_server, env):
    env.setenv("LEASH_REDUCE_CHUNK_TOKENS", "100")
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    short_answers(model_server)
    payload = {"items": REVIEWS[:60], "instruction": INSTRUCTION}
    first, _ = enqueue(conn, "reduce", payload)
    burst()
    done = ended(conn, first)
    calls = billed(model_server)[0]
    assert done["state"] == "succeeded" and calls == done["total"] > 3
    again, _ = enqueue(conn, "reduce", payload)
    burst()
    rerun = ended(conn, again)
    print(f"reduce of 60 items: {calls} calls; the re-run: {billed(model_server)[0] - calls} calls, "
          f"{rerun['usage']['cache_hits']} cache hits")
    assert rerun["state"] == "succeeded" and billed(model_server)[0] == calls  # not one call more
    assert rerun["usage"]["calls"] == 0 and rerun["usage"]["cache_hits"] == calls
    assert stored(conn, again)[0] == stored(conn, first)[0]


def test_a_reduce_under_a_token_budget_stops_at_it(conn, burst, model_server, env):
    env.setenv("LEASH_REDUCE_CHUNK_TOKENS", "100")
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    short_answers(model_server)
    job_id, _ = enqueue(conn, "reduce", {"items": REVIEWS, "instruction": INSTRUCTION, "budget": {"tokens": 1500},
                                         "item_concurrency": 2})
    burst()
    final = ended(conn, job_id)
    calls, prompt, completion = billed(model_server)
    print(f"reduce under a 1,500-token budget: {calls} calls, {prompt + completion:,} tokens billed")
    assert final["state"] == "failed" and final["error"].startswith("budget reached"), final["error"]
    assert 0 < prompt + completion <= 1500
    assert 0 not in stored(conn, job_id)


@pytest.mark.slow
def test_sigkill_mid_reduce_resumes_without_asking_a_finished_chunk_again(conn, workers, model_server, env):
    env.setenv("LEASH_REDUCE_CHUNK_TOKENS", "100")
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    env.setenv("LEASH_ITEM_CONCURRENCY", "2")
    short_answers(model_server)
    model_server.latency = 0.4
    job_id, _ = enqueue(conn, "reduce", {"items": REVIEWS, "instruction": INSTRUCTION}, max_attempts=3)
    first = workers.start("--no-scheduler")
    wait_for(lambda: conn.hlen(keys.items(job_id)) >= 6, 60, message="partials stored by the first worker")
    horse = workers.horse(first)
    os.kill(first.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    at_kill = set(stored(conn, job_id))
    asked_before = len(model_server.requests)
    workers.start("--no-scheduler")
    final = ended(conn, job_id, timeout=120)

    assert final["state"] == "succeeded" and final["attempts"] == 2, final["error"]
    assert stored(conn, job_id)[0] == stored(conn, job_id)[0] and 0 not in at_kill
    # A connection the killed work-horse cut before its body arrived reaches the server empty.
    asked_after = [seen.item for seen in model_server.requests[asked_before:] if seen.item]
    print(f"SIGKILL mid-reduce: {len(at_kill)} of {final['total']} calls stored at the kill, "
          f"{len(asked_after)} asked after it")
    assert len(asked_after) == final["total"] - len(at_kill)  # none the first attempt stored
    assert states.status(conn, job_id)["done"] == final["total"]


def test_the_dry_run_prices_the_chunk_tree_and_a_rerun_at_nothing(conn, burst, model_server, env):
    env.setenv("LEASH_REDUCE_CHUNK_TOKENS", "100")
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    env.setenv("LEASH_MODEL_PRICES", '{"fake-model": {"input": 1.0, "output": 2.0}}')
    short_answers(model_server)
    payload = {"items": REVIEWS[:60], "instruction": INSTRUCTION}
    before = dry_run(conn, "reduce", payload, owner="dana")
    job_id, _ = enqueue(conn, "reduce", payload, owner="dana")
    burst()
    done = ended(conn, job_id)
    after = dry_run(conn, "reduce", payload, owner="dana")
    print(f"dry run of a reduce of 60 items: {before['calls']} calls ({before['levels']}), worst case "
          f"{before['input_tokens']:,} + {before['output_tokens_max']:,} tokens; the run: {done['usage']['calls']} calls, "
          f"{done['usage']['input_tokens']:,} + {done['usage']['output_tokens']:,}; the re-run's: {after['calls']} calls")
    assert before["calls"] >= done["usage"]["calls"] and before["levels"][-1] == 1
    assert before["input_tokens"] >= done["usage"]["input_tokens"]
    assert before["output_tokens_max"] >= done["usage"]["output_tokens"]
    assert before["cost_usd_max"] >= done["cost_usd"] > 0
    assert after["calls"] == 0 and after["cached_items"] == done["usage"]["calls"] and after["cost_usd_max"] == 0
    assert after["cost_usd_expected"] is not None  # the owner's reduce calls have answered since


def test_a_reduce_whose_items_are_another_jobs_is_priced_for_an_assumed_count(conn, model_server, env):
    env.setenv("LEASH_REDUCE_CHUNK_TOKENS", "1000")
    env.setenv("LEASH_MODEL_PRICES", '{"fake-model": {"input": 1.0, "output": 2.0}}')
    payload = {"items_from": {"job": "J", "results": True}, "instruction": INSTRUCTION}
    unknown = estimate_reduce(conn, payload, "dana")
    assert unknown["calls"] == 0 and unknown["items"] == 0  # priced as 0 items, as items_from is
    assumed = estimate_reduce(conn, payload, "dana", item_count=100, item_chars=200)
    assert assumed["items"] == 100 and assumed["items_assumed"]
    # Each assumed item 200 characters of four bytes, 201 estimated tokens (a character that is
    # not ASCII counts one): 4 items a chunk.
    assert assumed["levels"][0] == 25
    assert assumed["calls"] == sum(assumed["levels"]) and assumed["cost_usd_max"] > 0
    worst = estimate_reduce(conn, payload, "dana", item_count=100)  # each as long as LEASH_MAX_ITEM_CHARS
    assert worst["cost_usd_max"] > assumed["cost_usd_max"]


def test_a_reduce_over_results_leaves_out_the_items_that_errored(conn, burst, model_server):
    items = ["kettle -> negative", "lid -> banana", "handle -> positive"]  # the second: an off-label answer
    source, _ = enqueue(conn, "classify", {"items": items, "labels": ["positive", "negative"], "max_item_errors": 1})
    job_id, _ = enqueue(conn, "reduce", {"items_from": {"job": source, "results": True}, "instruction": INSTRUCTION})
    burst()
    assert ended(conn, source)["item_errors"] == 1
    assert ended(conn, job_id)["state"] == "succeeded"
    # An error is not an answer to summarise: the results are the labels the model gave.
    assert results.submitted_items(conn, job_id) == ["negative", "positive"]
