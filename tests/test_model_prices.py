"""Prices by model name where the address's provider is unknown (a proxy, a gateway, your own
server): the genai-prices table's lookup across providers, LEASH_MODEL_PRICES first; and
"cost unknown" that names the model and what to set."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import main
from jobs import runner
from jobs.core import lease, states
from jobs.enqueue import enqueue
from jobs.usage.meter import Pending
from jobs.usage.prices import Price, price_for, why_no_price
from jobs.usage.report import cost_text, spend_text

PROXY = "https://llm-proxy.internal.example/v1"
MINE = "http://127.0.0.1:8000/v1"


def test_a_known_model_behind_an_unknown_address_is_priced_by_its_name_across_providers(env):
    direct = price_for("gpt-4o-mini", provider_url="https://api.openai.com/v1")
    for url in (PROXY, MINE, "https://gateway.example.com/openai/v1"):
        by_name = price_for("gpt-4o-mini", provider_url=url)
        assert by_name is not None, url
        assert (by_name.input, by_name.output, by_name.cached_input) == (direct.input, direct.output, direct.cached_input)
        assert by_name.source == "genai-prices openai (by model name)" and by_name.batch == 0.5
    claude = price_for("claude-3-5-haiku-latest", provider_url=PROXY)
    assert claude.input == pytest.approx(0.8) and claude.output == pytest.approx(4.0)
    assert claude.source == "genai-prices anthropic (by model name)"
    gateway = price_for("openai/gpt-4o-mini", provider_url=PROXY)  # LiteLLM's and OpenRouter's form
    assert gateway is not None and gateway.input == direct.input
    assert price_for("smollm2-135m", provider_url=MINE) is None  # no provider has it
    # A provider the table knows by its address prices its own models only.
    assert price_for("claude-3-5-haiku-latest", provider_url="https://api.openai.com/v1") is None


def test_leash_model_prices_still_wins_over_the_name_lookup(env):
    env.setenv("LEASH_MODEL_PRICES", json.dumps({"gpt-4o-mini": {"input": 1, "output": 2}}))
    assert price_for("gpt-4o-mini", provider_url=PROXY) == Price(1.0, 2.0)


def test_cost_unknown_names_the_model_and_what_to_set(env):
    env.setenv("LEASH_MODEL_NAME", "smollm2-135m")
    env.setenv("LEASH_MODEL_URL", MINE)
    text = cost_text(None, 3)
    assert text == ('cost unknown: no price for smollm2-135m: the genai-prices table has no such model under any '
                    'provider; set LEASH_MODEL_PRICES to {"smollm2-135m": {"input": <USD per 1M tokens>, '
                    '"output": <USD per 1M tokens>}}')
    # Set, but without this model: it says so, instead of telling to set what is set.
    env.setenv("LEASH_MODEL_PRICES", json.dumps({"other-model": {"input": 1, "output": 2}}))
    lacking = cost_text(None, 3)
    assert "LEASH_MODEL_PRICES is set but has no entry for it; add {\"smollm2-135m\"" in lacking
    assert "set LEASH_MODEL_PRICES" not in lacking
    # Named now: the calls counted before it stay unpriced, and the text says why.
    env.setenv("LEASH_MODEL_PRICES", json.dumps({"smollm2-135m": {"input": 1, "output": 2}}))
    assert why_no_price("smollm2-135m") == ("smollm2-135m's calls ran before LEASH_MODEL_PRICES named its price; "
                                            "later calls are priced")
    # At a provider the table knows, the address is named.
    assert why_no_price("no-such-model", "https://api.openai.com/v1").startswith(
        "no price for no-such-model: LEASH_MODEL_PRICES is set but has no entry")
    env.delenv("LEASH_MODEL_PRICES")
    assert "has no such model at https://api.openai.com/v1;" in why_no_price("no-such-model", "https://api.openai.com/v1")


def test_leash_usage_names_each_model_without_a_price(conn, env):
    env.setenv("LEASH_MODEL_URL", MINE)
    job_id, _ = enqueue(conn, "classify", {"items": ["a", "b"], "labels": ["x", "y"]}, owner="alice")
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.heartbeat(item=(0, '"x"'), usage=Pending("smollm2-135m", "classify", calls=1, input=100, output=2,
                                                     unpriced=1))
    attempt.heartbeat(item=(1, '"y"'), usage=Pending("gpt-4o-mini", "classify", calls=1, input=100, output=2,
                                                     nusd=16_200))
    result = CliRunner().invoke(main, ["usage", "--owner", "alice"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.startswith("  gpt-4o-mini / classify") and "$0.000016" in line for line in lines)
    assert any(line.startswith("  smollm2-135m / classify") and line.endswith("cost unknown") for line in lines)
    assert "cost unknown: no price for smollm2-135m: the genai-prices table has no such model under any provider" \
        in result.stdout
    assert "no price for gpt-4o-mini" not in result.stdout


def test_a_job_on_a_server_the_table_does_not_know_gets_the_models_price(conn, env, model_server):
    """A proxy in front of OpenAI: the loopback stand-in, called with the model name gpt-4o-mini."""
    env.setenv("LEASH_MODEL_NAME", "gpt-4o-mini")
    payload = {"items": ["good", "great", "fine"], "template": "Say it back: {item}"}
    job_id, _ = enqueue(conn, "prompt", payload)
    runner.execute("prompt", payload, attempt=lease.claim(conn, job_id, "leash", "w"))
    fields = states.status(conn, job_id)
    assert fields["state"] == "succeeded", fields.get("error")
    usage = fields["usage"]
    price = price_for("gpt-4o-mini", provider_url="https://api.openai.com/v1")
    assert usage["calls"] == 3 and fields["cost_usd"] is not None
    expected = price.nano_usd(usage["input_tokens"], usage["output_tokens"], usage["cached_input_tokens"]) / 1e9
    assert fields["cost_usd"] == pytest.approx(expected)
    assert "cost unknown" not in spend_text(fields)
