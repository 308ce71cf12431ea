"""Batch mode at the doors: the API's ``mode`` field, ``leash submit --mode`` and the form's
choice; a kind that makes no one call per item, or a backend without a batch API, is refused
with a message naming the field; a waiting job reads as such in ``leash status`` and ``leash
watch``."""

from __future__ import annotations

import json

from click.testing import CliRunner
from rq.job import Job
from rq.serializers import JSONSerializer

from cli import main, status_text
from cli.watch import facts
from jobs import keys
from tests.web_support import HTML, csrf_from

CLASSIFY_BATCH = {"kind": "classify", "items": ["a", "b"], "labels": ["x", "y"], "mode": "batch"}


def payload_of(conn, job_id):
    return Job.fetch(job_id, connection=conn, serializer=JSONSerializer).args[1]


def test_the_api_takes_mode_batch_when_the_backend_has_a_batch_api(client, conn, model_server):
    response = client.post("/jobs", json=CLASSIFY_BATCH)
    assert response.status_code == 202, response.get_json()
    job_id = response.get_json()["job_id"]
    assert payload_of(conn, job_id)["mode"] == "batch"
    status = client.get(f"/jobs/{job_id}").get_json()
    assert status["mode"] == "batch" and status["batch"]["phase"] is None and status["state"] == "queued"


def test_the_api_refuses_a_batch_it_cannot_run_with_a_422_naming_the_field(client, conn, env):
    env.setenv("LEASH_MODEL_BACKEND", "local")
    offline = client.post("/jobs", json=CLASSIFY_BATCH)
    assert offline.status_code == 422
    assert "'mode'" in offline.get_json()["error"] and "no batch API" in offline.get_json()["error"]
    env.setenv("LEASH_MODEL_BACKEND", "openai")
    env.setenv("LEASH_MODEL_NAME", "m")
    odd = client.post("/jobs", json=CLASSIFY_BATCH | {"mode": "later"})
    assert odd.status_code == 422 and "'mode' must be \"direct\" or \"batch\"" in odd.get_json()["error"]
    other_kind = client.post("/jobs", json={"kind": "count", "items": ["a"], "mode": "batch"})
    assert other_kind.status_code == 422
    assert "kind 'count' does not support batch mode" in other_kind.get_json()["error"]
    assert not conn.keys(keys.job("*"))


def test_leash_submit_mode_batch(conn, env, model_server):
    runner = CliRunner()
    result = runner.invoke(main, ["submit", "--labels", "a,b", "--mode", "batch", "--json", "-"], input="x\ny\n")
    assert result.exit_code == 0, result.output
    assert payload_of(conn, json.loads(result.stdout)["job_id"])["mode"] == "batch"
    env.setenv("LEASH_MODEL_BACKEND", "local")
    refused = runner.invoke(main, ["submit", "--labels", "a,b", "--mode", "batch", "-"], input="x\n")
    assert refused.exit_code == 2 and "--mode" in refused.output and "Traceback" not in refused.output


def test_the_form_offers_the_mode_and_says_when_the_backend_cannot(app, conn, env, model_server):
    browser = app.test_client()
    page = browser.get("/", headers=HTML)
    assert b'name="mode"' in page.data and b'<option value="batch"' in page.data
    data = {"kind": "prompt", "template": "Say {item}", "items": "a\nb", "mode": "batch",
            "csrf_token": csrf_from(page.data), "submission": "form-batch-1"}
    accepted = browser.post("/", data=data, headers=HTML, content_type="multipart/form-data")
    assert accepted.status_code == 303
    job_id = accepted.headers["Location"].rsplit("/", 1)[1]
    assert payload_of(conn, job_id)["mode"] == "batch"
    env.setenv("LEASH_MODEL_BACKEND", "local")
    refused = browser.post("/", data=data | {"submission": "form-batch-2"}, headers=HTML,
                           content_type="multipart/form-data")
    assert refused.status_code == 422 and b"no batch API" in refused.data


WAITING = {"job_id": "j1", "name": None, "state": "running", "stale": False, "kind": "prompt", "done": 0,
           "total": 10, "attempts": 1, "max_attempts": 3, "canceled": False, "error": None, "history": [],
           "created_at": "2026-01-01T00:00:00+00:00", "waiting": "at the provider: 4 of 10 requests done, 0 failed; "
           "leash looks next at 12:00:30 UTC (no worker held)", "mode": "batch",
           "batch": {"phase": "waiting", "done": 4, "failed": 0, "total": 10, "batches": 1,
                     "next_look_at": "2026-01-01T12:00:30+00:00", "direct": 0}}


def test_status_and_watch_say_a_job_waits_at_the_provider():
    text = "\n".join(status_text.lines(WAITING, "http://x/jobs/j1"))
    assert "running, waiting at the provider (no worker held)" in text
    assert "batch: 1 provider batch(es), 4 of 10 requests done there" in text
    assert "leash looks next at 12:00:30 UTC" in text
    assert "at the provider: 4 of 10" in facts(WAITING) and "ETA" not in facts(WAITING)
    stale = facts(WAITING | {"stale": True})
    assert stale.startswith("running, STALE: no look at its batch when due")
