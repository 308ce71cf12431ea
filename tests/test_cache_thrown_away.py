"""Nothing thrown away is cached: an off-label answer, a failed correction, an answer still
invalid after its repairs and an answer cut off at max_tokens are paid for and counted, never
stored in the request cache nor served from it; a re-run (after the model was fixed) asks
exactly those items again, while the answers its items kept are served at no cost."""

from __future__ import annotations

import pytest

from jobs import keys
from jobs.enqueue import enqueue
from jobs.models import cache
from jobs.models.provider import COMPLETE, CUT_OFF, Answer, CallRequest
from jobs.models.structured import DEFAULT_TEMPLATE
from tests.conftest import run_burst
from tests.fake_openai import Reply
from tests.test_items_workers import ended, stored
from tests.test_usage_workers import billed, counted

LABELS = ["positive", "negative"]
SCHEMA = {"type": "object", "additionalProperties": False,
          "properties": {"product": {"type": "string"}, "stars": {"type": "integer"}},
          "required": ["product", "stars"]}


def run(conn, kind: str, payload: dict) -> dict:
    job_id, _ = enqueue(conn, kind, payload, owner="dana")
    run_burst()
    return ended(conn, job_id) | {"job_id": job_id}


def entries(conn) -> int:
    return conn.zcard(keys.CACHE_INDEX)


@pytest.fixture
def server(conn, model_server, env):
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    env.setenv("LEASH_ITEM_CONCURRENCY", "4")
    return model_server


def test_off_label_answers_and_failed_corrections_are_asked_again_after_the_model_is_fixed(conn, server):
    good = [f"review {i} -> positive" for i in range(6)]
    off = [f"review {i} -> maybe" for i in range(6, 10)]
    first = run(conn, "classify", {"items": good + off, "labels": LABELS})
    # Six first answers kept; four off-label first answers and four failed corrections paid for.
    assert billed(server)[0] == 6 + 4 * 2 and counted(first) == billed(server)
    assert first["result"]["summary"]["errors"] == 4
    assert entries(conn) == 6  # only the kept ones

    server.answer = lambda item: "negative"  # the model is fixed
    second = run(conn, "classify", {"items": good + off, "labels": LABELS})
    again = [s.item for s in server.requests[14:]]
    assert sorted(again) == sorted(off), again  # exactly the four thrown away, once each
    assert second["usage"]["calls"] == 4 and second["usage"]["cache_hits"] == 6
    assert second["result"]["summary"]["errors"] == 0
    results = stored(conn, second["job_id"])
    assert [results[i] for i in range(10)] == ["positive"] * 6 + ["negative"] * 4


def test_answers_invalid_after_their_repairs_are_asked_again(conn, server, env):
    env.setenv("LEASH_REPAIR_ATTEMPTS", "1")
    items = [f"review {i} of gadget{i}" for i in range(5)]
    for item in items[:4]:  # not JSON, first and repaired: four items end invalid
        server.on(DEFAULT_TEMPLATE.replace("{item}", item), Reply("not json"), times=2)
    first = run(conn, "extract", {"items": items, "schema": SCHEMA, "max_invalid": 5})
    assert first["state"] == "succeeded" and first["result"]["summary"]["invalid"] == 4
    assert billed(server)[0] == 9 and entries(conn) == 1

    second = run(conn, "extract", {"items": items, "schema": SCHEMA, "max_invalid": 5})  # the model answers now
    assert second["usage"]["calls"] == 4 and second["usage"]["cache_hits"] == 1
    assert second["result"]["summary"] == {"items": 5, "valid": 5, "invalid": 0}
    assert entries(conn) == 5
    third = run(conn, "extract", {"items": items, "schema": SCHEMA, "max_invalid": 5})
    assert third["usage"]["calls"] == 0 and third["usage"]["cache_hits"] == 5 and billed(server)[0] == 13


def test_a_repaired_answer_is_cached_but_the_broken_first_answer_is_not(conn, server):
    items = [f"review {i} of gadget{i}" for i in range(4)]
    server.schema_answers = "break_first"
    first = run(conn, "extract", {"items": items, "schema": SCHEMA})
    assert first["state"] == "succeeded" and billed(server)[0] == 8
    assert entries(conn) == 4  # the repairs' requests, not the first ones
    # The first requests are asked again (and answered validly now): no repair, nothing broken served.
    second = run(conn, "extract", {"items": items, "schema": SCHEMA})
    assert second["state"] == "succeeded" and second["usage"]["calls"] == 4
    assert stored(conn, second["job_id"]) == stored(conn, first["job_id"])


def test_answers_cut_off_at_max_tokens_are_asked_again(conn, server, env):
    env.setenv("LEASH_MODEL_MAX_TOKENS", "4")
    items = [f"a long review number {i} that the echo cannot fit in four tokens" for i in range(3)]
    first = run(conn, "prompt", {"items": items, "template": "Say it back: {item}"})
    assert "cut off" in str(stored(conn, first["job_id"])[0])
    assert entries(conn) == 0
    second = run(conn, "prompt", {"items": items, "template": "Say it back: {item}"})
    assert second["usage"]["calls"] == 3 and second["usage"]["cache_hits"] == 0 and billed(server)[0] == 6


def test_an_entry_without_the_kept_mark_or_cut_off_is_a_miss():
    kept = Answer("positive", COMPLETE, "stop", cache.NO_USAGE)
    assert cache.decode(cache.encode(kept)).text == "positive"
    assert cache.decode('["positive","complete","stop"]') is None  # written before answers were judged
    assert cache.decode('["posit","cut off","length","kept"]') is None
    request = CallRequest([{"role": "user", "content": "x"}], 8)
    assert not cache.cacheable(Answer("posit", CUT_OFF, "length", cache.NO_USAGE), request)
    assert not cache.cacheable(kept, CallRequest([{"role": "user", "content": "x"}], 8, budget_cut=True))
    assert cache.cacheable(kept, request)
