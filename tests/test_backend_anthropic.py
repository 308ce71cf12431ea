"""The Anthropic backend beyond the error mapping it shares with the OpenAI one
(tests/test_backend_openai.py and tests/test_backend_units.py run those against both): its 529
on a worker, a cut-off answer in a job, usage with Anthropic's separately counted cached
tokens priced to the cent of what the fake server billed (and read from a response), and prices
found at Anthropic's address when LEASH_MODEL_URL is unset."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.enqueue import enqueue
from jobs.models.anthropic_backend import AnthropicBackend, _usage
from jobs.models.backends import get_backend
from jobs.models.provider import CallRequest, Usage, estimated_usage
from jobs.usage.prices import Price
from tests.fake_openai import Error, Reply
from tests.test_backend_openai import ended, error_history, item_results


@pytest.mark.slow
def test_529_overloaded_waits_in_place_and_the_job_goes_on(conn, burst, anthropic_server):
    anthropic_server.on("b", Error(529, "Overloaded", headers={"retry-after": "2"}))
    job_id, _ = enqueue(conn, "prompt", {"items": ["a", "b", "c"], "template": "{item}"})
    burst()
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert final["attempts"] == 1 and error_history(conn, job_id) == []
    refused, answered = anthropic_server.seen("b")
    print(f"529 retry-after 2 s: the retry came {answered.at - refused.at:.2f} s later")
    assert 2.0 <= answered.at - refused.at < 4.0


@pytest.mark.slow
def test_an_answer_cut_off_at_max_tokens_is_that_items_error_and_the_job_goes_on(conn, burst, provider_server, env):
    provider_server.on("long", Reply("Once upon a", finish_reason=provider_server.cut_off))
    job_id, _ = enqueue(conn, "prompt", {"items": ["short", "long"], "template": "{item}"})
    env.setenv("LEASH_MODEL_MAX_TOKENS", "16")
    burst()
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    results = item_results(conn, job_id)
    assert results[0] == "echo: short"
    assert results[1] == {"error": "answer cut off at max_tokens=16; raise LEASH_MODEL_MAX_TOKENS"}


@pytest.mark.slow
def test_a_jobs_usage_and_cost_are_what_the_server_billed_cached_tokens_included(conn, burst, anthropic_server, env):
    anthropic_server.cache_read = 5  # each answer: 5 of its prompt tokens read from the cache
    env.setenv("LEASH_MODEL_PRICES", '{"fake-model": {"input": 3.0, "output": 15.0, "cached_input": 0.3}}')
    items = [f"item {i} " + "word " * i for i in range(12)]
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": "Say it back: {item}"})
    burst()
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    with anthropic_server.lock:
        prompt = sum(p for p, _ in anthropic_server.billed)
        completion = sum(c for _, c in anthropic_server.billed)
        cached = sum(anthropic_server.billed_cached)
        calls = len(anthropic_server.billed)
    assert calls == 12 and cached == 5 * 12
    usage = final["usage"]
    # Anthropic's input_tokens leave the cached ones out; leash's input counts the whole prompt.
    assert (usage["calls"], usage["input_tokens"], usage["output_tokens"], usage["cached_input_tokens"]) == (
        calls, prompt, completion, cached)
    assert not usage["estimated"]
    assert final["cost_usd"] == pytest.approx(((prompt - cached) * 3.0 + cached * 0.3 + completion * 15.0) / 1e6)


def test_without_leash_model_url_a_claude_model_gets_anthropics_price(conn, env):
    env.delenv("LEASH_MODEL_URL", raising=False)
    env.delenv("LEASH_MODEL_PRICES", raising=False)
    env.setenv("LEASH_MODEL_BACKEND", "anthropic")
    env.setenv("LEASH_MODEL_NAME", "claude-3-5-haiku-latest")
    backend = get_backend()  # sends nothing
    assert isinstance(backend, AnthropicBackend) and str(backend.client.base_url).rstrip("/") == "https://api.anthropic.com"
    assert backend.price == Price(0.8, 4.0, 0.08, source="genai-prices anthropic")
    # A tiered price is read at its first tier (Sonnet 4.5: $3 up to 200k prompt tokens, $6 above).
    env.setenv("LEASH_MODEL_NAME", "claude-sonnet-4-5")
    assert get_backend().price.input == pytest.approx(3.0)
    # The same name at an address the price table does not know (a proxy, a gateway) is priced
    # by the model's name; a name no provider has is not priced at all.
    env.setenv("LEASH_MODEL_URL", "http://127.0.0.1:9")
    assert get_backend().price.source == "genai-prices anthropic (by model name)"
    env.setenv("LEASH_MODEL_NAME", "my-own-claude-finetune")
    assert get_backend().price is None


def test_usage_counts_the_whole_prompt_as_input_with_the_cached_part_apart():
    request = CallRequest([{"role": "user", "content": "x" * 41}], max_tokens=8)
    reported = SimpleNamespace(usage=SimpleNamespace(
        input_tokens=10, output_tokens=5, cache_read_input_tokens=20, cache_creation_input_tokens=3))
    # Anthropic's input_tokens (10) leave out the 20 read from and the 3 written to its cache.
    assert _usage(reported, request, "y") == Usage(33, 5, cached_input_tokens=20, estimated=False)
    plain = SimpleNamespace(usage=SimpleNamespace(input_tokens=10, output_tokens=5))
    assert _usage(plain, request, "y") == Usage(10, 5, cached_input_tokens=None, estimated=False)
    assert _usage(SimpleNamespace(usage=None), request, "y") == estimated_usage(request, "y")
