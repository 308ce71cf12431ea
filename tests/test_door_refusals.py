"""The door refuses what would fail later: a USD budget for a model with no known price is a
422 (API, form) or exit 2 (`leash submit`) naming the model and the setting, where the job used
to be accepted and then fail at the worker with "budget reached ... no price"."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import exit_codes, main
from tests.web_support import create_app_with

JOB = {"kind": "prompt", "items": ["a", "b"], "template": "Say {item}"}


@pytest.fixture
def unpriced_model(env):
    env.setenv("LEASH_MODEL_BACKEND", "openai")
    env.setenv("LEASH_MODEL_URL", "http://127.0.0.1:9/v1")
    env.setenv("LEASH_MODEL_NAME", "house-model-7b")
    env.setenv("LEASH_MODEL_API_KEY", "sk-test")
    env.delenv("LEASH_MODEL_PRICES", raising=False)
    return env


def test_a_usd_budget_without_a_price_is_refused_at_every_door(conn, unpriced_model):
    client = create_app_with().test_client()
    response = client.post("/jobs", json={**JOB, "budget": {"usd": 1}})
    assert response.status_code == 422, response.get_json()
    error = response.get_json()["error"]
    assert "house-model-7b" in error and "LEASH_MODEL_PRICES" in error and "tokens" in error
    dry = client.post("/jobs", json={**JOB, "budget": {"usd": 1}, "dry_run": True})
    assert dry.status_code == 422
    result = CliRunner().invoke(main, ["submit", "--kind", "prompt", "--template", "Say {item}", "--budget-usd", "1"],
                                input="a\nb\n")
    assert result.exit_code == exit_codes.BAD_INPUT == 2, result.output
    assert "house-model-7b" in result.output and "LEASH_MODEL_PRICES" in result.output
    assert "Traceback" not in result.output


def test_a_token_budget_or_a_priced_model_goes_through(conn, unpriced_model):
    client = create_app_with().test_client()
    assert client.post("/jobs", json={**JOB, "budget": {"tokens": 5000}}).status_code == 202
    unpriced_model.setenv("LEASH_MODEL_PRICES", json.dumps({"house-model-7b": {"input": 1, "output": 2}}))
    assert client.post("/jobs", json={**JOB, "budget": {"usd": 1}}).status_code == 202


def test_leash_submit_reads_a_csv_and_a_non_utf8_file_as_the_form_does(conn, tmp_path):
    from rq.job import Job
    from rq.serializers import JSONSerializer

    table = tmp_path / "reviews.csv"
    table.write_text("id,text,stars\n1,the kettle is fine,4\n2,\"loud, but it works\",3\n", encoding="utf-8")
    run = CliRunner()
    result = run.invoke(main, ["submit", "--kind", "classify", "--labels", "good,bad", str(table)])
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip().splitlines()[-1]
    items = Job.fetch(job_id, connection=conn, serializer=JSONSerializer).args[1]["items"]
    assert items == ["the kettle is fine", "loud, but it works"]  # the text column, no header, not raw lines

    latin = tmp_path / "items.txt"
    latin.write_bytes("café au lait\n".encode("latin-1"))
    refused = run.invoke(main, ["submit", "--kind", "classify", "--labels", "good,bad", str(latin)])
    assert refused.exit_code == exit_codes.BAD_INPUT and "not UTF-8" in refused.output, refused.output
    assert refused.exception is None or isinstance(refused.exception, SystemExit)
