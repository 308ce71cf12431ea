"""A budget under repairs and corrections: an item's next call (extract's repair, classify's
correction after an off-label answer) waits only for calls in flight, never for room that
answered calls hold while they wait for their own -- so a job whose every item needs one
progresses: it succeeds when its need fits its budget, and when it does not it stops "budget
reached" having billed at least 90 % of it, never more, and never asks twice for an answer it
received (against the stand-in provider that bills every answer)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from jobs.enqueue import enqueue
from jobs.models.provider import CallRequest
from tests.conftest import run_burst
from tests.fake_openai import Reply
from tests.test_items_workers import ended, stored
from tests.test_usage_workers import billed, counted

SCHEMA = {"type": "object", "additionalProperties": False,
          "properties": {"product": {"type": "string"}, "stars": {"type": "integer"}},
          "required": ["product", "stars"]}
LABELS = ["positive", "negative"]
#: Ends well within its tests' own deadlines when nothing loops; a job that pays in a loop
#: (waits a minute in place, is deferred, asks its first calls again) is still running.
DEADLINE = 90


def repeated(server) -> int:
    """Requests the stand-in was sent more than once (the same messages and max_tokens)."""
    with server.lock:
        sent = Counter(json.dumps([s.body.get("messages"), s.body.get("max_tokens") or
                                   s.body.get("max_completion_tokens")], sort_keys=True) for s in server.requests)
    return sum(n - 1 for n in sent.values() if n > 1)


def worst_call(server) -> int:
    """The largest worst case (input bound + max_tokens) of any request the stand-in was sent."""
    with server.lock:
        bodies = [s.body for s in server.requests]
    return max(CallRequest(b["messages"], b.get("max_tokens") or b.get("max_completion_tokens")).worst_case_tokens()
               for b in bodies)


def run(conn, kind: str, payload: dict) -> dict:
    job_id, _ = enqueue(conn, kind, payload, owner="dana")
    run_burst(follow=DEADLINE)
    return ended(conn, job_id, timeout=DEADLINE) | {"job_id": job_id}


@pytest.fixture
def extract_server(model_server, env):
    """Every item's first answer breaks the schema (one repair each); one call's worst case is
    about a tenth of a 16,000-token budget, 16 items at once."""
    env.setenv("LEASH_ITEM_CONCURRENCY", "16")
    env.setenv("LEASH_MODEL_MAX_TOKENS", "1200")
    env.setenv("LEASH_REPAIR_ATTEMPTS", "1")
    model_server.schema_answers = "break_first"
    return model_server


def extract_items(count: int) -> list[str]:
    return [f"review {i:03d} of gadget{i}: arrived late, works well, a little loud" for i in range(count)]


def test_extract_with_a_repair_for_every_item_succeeds_when_its_need_fits(conn, extract_server):
    final = run(conn, "extract", {"items": extract_items(40), "schema": SCHEMA, "budget": {"tokens": 16000}})
    calls, prompt, completion = billed(extract_server)
    print(f"extract, 40 items each repaired once, 16,000-token budget at 16 at once: {final['state']}, "
          f"{calls} calls paid (80 needed), {prompt + completion:,} tokens ({(prompt + completion) / 16000:.1%}), "
          f"{repeated(extract_server)} repeated")
    assert final["state"] == "succeeded", final["error"]
    assert final["done"] == 40 and final["result"]["summary"]["valid"] == 40
    assert calls == 80 and repeated(extract_server) == 0
    assert counted(final) == (calls, prompt, completion) and prompt + completion <= 16000


def test_extract_with_a_repair_for_every_item_stops_at_90_percent_when_its_need_does_not_fit(
        conn, extract_server):
    final = run(conn, "extract", {"items": extract_items(200), "schema": SCHEMA, "budget": {"tokens": 16000}})
    calls, prompt, completion = billed(extract_server)
    share = (prompt + completion) / 16000
    assert 16000 >= 10 * worst_call(extract_server)
    print(f"extract, 200 items each repaired once, 16,000-token budget: {final['state']} after {final['done']} "
          f"items, {calls} calls, {share:.1%} of the budget, {repeated(extract_server)} repeated")
    assert final["state"] == "failed" and final["error"].startswith("budget reached"), final["error"]
    assert 0.9 <= share <= 1.0
    assert repeated(extract_server) == 0 and counted(final) == (calls, prompt, completion)
    assert final["done"] >= 20 and final["budget_wait"] is None
    # Each item stored is the repaired object; the job's replay resumes from them.
    assert all(set(value) == {"product", "stars"} for value in stored(conn, final["job_id"]).values())


@pytest.fixture
def classify_server(model_server, env):
    """Every item's first answer is off-label; its correction names a label."""
    env.setenv("LEASH_ITEM_CONCURRENCY", "16")
    return model_server


def classify_items(server, count: int) -> list[str]:
    items = [f"review {i:03d}: fine -> positive" for i in range(count)]
    for item in items:
        server.on(item, Reply("it is hard to say"))
    return items


@pytest.mark.parametrize(("budget", "count"), [(1200, 6), (2400, 14)])
def test_classify_with_a_correction_for_every_item_succeeds_when_its_need_fits(
        conn, classify_server, budget, count):
    items = classify_items(classify_server, count)
    final = run(conn, "classify", {"items": items, "labels": LABELS, "budget": {"tokens": budget}})
    calls, prompt, completion = billed(classify_server)
    print(f"classify, {count} items each corrected once, {budget:,}-token budget: {final['state']}, {calls} calls "
          f"({2 * count} needed), {(prompt + completion) / budget:.1%} of the budget, "
          f"{repeated(classify_server)} repeated")
    assert final["state"] == "succeeded", final["error"]
    assert stored(conn, final["job_id"]) == dict.fromkeys(range(count), "positive")
    assert calls == 2 * count and repeated(classify_server) == 0
    assert counted(final) == (calls, prompt, completion) and prompt + completion <= budget


@pytest.mark.parametrize("budget", [1200, 2400])
def test_classify_with_a_correction_for_every_item_stops_at_90_percent_when_its_need_does_not_fit(
        conn, classify_server, budget):
    items = classify_items(classify_server, 60)
    final = run(conn, "classify", {"items": items, "labels": LABELS, "budget": {"tokens": budget}})
    calls, prompt, completion = billed(classify_server)
    share = (prompt + completion) / budget
    worst = worst_call(classify_server)
    print(f"classify, 60 items each corrected once, {budget:,}-token budget ({budget / worst:.1f} worst cases): "
          f"{final['state']} after {final['done']} items, {calls} calls, {share:.1%} of the budget, "
          f"{repeated(classify_server)} repeated")
    assert final["state"] == "failed" and final["error"].startswith("budget reached"), final["error"]
    # It stops only when what is left cannot hold one more call: at least 90 % of a budget of
    # ten worst cases or more.
    assert budget - prompt - completion < worst and share <= 1.0
    assert share >= 0.9 or budget < 10 * worst
    assert repeated(classify_server) == 0 and counted(final) == (calls, prompt, completion)
    assert set(stored(conn, final["job_id"]).values()) <= {"positive"}
