"""The deployment decides what depends on the model: workers publish their model settings (no
API key, no password), and a dry run and the estimate a job keeps use them, not the settings of
the terminal that typed the command. Workers run against the loopback model server; the
command line here has none of the LEASH_MODEL_* variables."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from cli import main
from jobs import keys
from jobs.intake import deployed_model as deployment
from tests.conftest import wait_for
from tests.fake_openai import API_KEY, MODEL

pytestmark = pytest.mark.slow

PRICES = json.dumps({MODEL: {"input": 1.0, "output": 2.0}})
ITEMS = "".join(f"review {i} -> positive\n" for i in range(10))


def cli(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def test_a_terminal_without_the_model_settings_prices_with_the_workers_model(conn, workers, model_server, env):
    model_env = {name: os.environ[name] for name in ("LEASH_MODEL_URL", "LEASH_MODEL_NAME", "LEASH_MODEL_API_KEY")}
    url = model_server.url.replace("http://", "http://someone:hunter2@")  # a password in the URL is not published
    workers.start("--no-scheduler", extra_env=model_env | {"LEASH_MODEL_PRICES": PRICES, "LEASH_MODEL_URL": url})
    for name in model_env:  # this terminal: the offline `local` backend
        env.delenv(name)
    entry = wait_for(lambda: deployment.published(conn, "leash"), 60, message="the worker to publish its settings")
    raw = conn.get(keys.model_settings("leash")).decode()
    assert API_KEY not in raw and "hunter2" not in raw and "someone" not in raw
    assert entry["settings"]["LEASH_MODEL_NAME"] == MODEL and entry["settings"]["LEASH_MODEL_URL"] == model_server.url
    assert 0 < conn.ttl(keys.model_settings("leash")) <= deployment.TTL_SECONDS

    dry = cli("submit", "--labels", "positive,negative", "--dry-run", "--json", "-", input=ITEMS)
    assert dry.exit_code == 0, dry.output
    figures = json.loads(dry.stdout)["estimate"]
    assert figures["cost_usd_max"] > 0 and figures["calls"] == 10, figures
    assert f"{MODEL} via openai" in figures["model_settings"] and "workers of queue 'leash'" in figures["model_settings"]
    words = cli("submit", "--labels", "positive,negative", "--dry-run", "-", input=ITEMS).output
    assert "the offline `local` backend" not in words and f"{MODEL} via openai at {model_server.url}" in words

    submitted = cli("submit", "--labels", "positive,negative", "--json", "-", input=ITEMS)
    job_id = json.loads(submitted.stdout)["job_id"]
    kept = json.loads(conn.get(keys.estimate(job_id)))
    assert kept["cost_usd_max"] == figures["cost_usd_max"] and MODEL in kept["model_settings"]

    # No worker has published (the entry expired): the terminal says whose settings priced it.
    conn.delete(keys.model_settings("leash"))
    workers.cleanup()
    alone = cli("submit", "--labels", "positive,negative", "--dry-run", "-", input=ITEMS).output
    assert ("no worker of queue 'leash' has published its model settings; priced with this process's: "
            "local (the offline backend)") in alone, alone


def test_published_settings_are_read_in_place_of_the_environment_and_only_within(conn, env):
    env.delenv("LEASH_MODEL_URL", raising=False)
    env.setenv("LEASH_MODEL_NAME", "terminal-model")
    conn.set(keys.model_settings("leash"), json.dumps({"settings": {
        "LEASH_MODEL_URL": "http://127.0.0.1:9/v1", "LEASH_MODEL_NAME": "deployed-model"}, "worker": "w", "at": 0}))
    from jobs import config

    with deployment.priced_with(conn, "leash") as source:
        assert config.model_calls().model_name == "deployed-model"
        assert config.model_calls().model_url == "http://127.0.0.1:9/v1"
        assert config.model_calls().model_prices is None  # unset by the workers: unset here too
        assert "deployed-model via openai" in source
    assert config.model_calls().model_name == "terminal-model" and config.model_calls().model_url is None
