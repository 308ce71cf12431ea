"""Canceling a pipeline while a stage's batch is at its provider, on a real ``leash worker`` against
the loopback provider's batch API: every stage canceled, and each door says what the provider said
of the batch, as canceling the job alone does (``leash cancel``, ``POST /jobs/<id>/cancel``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import main
from jobs.core import states
from jobs.intake import pipelines, submission
from tests.conftest import batch_settings
from tests.test_batch_jobs import only_batch, waiting

pytestmark = pytest.mark.slow

BODY = {"name": "b", "stages": [
    {"name": "first", "kind": "prompt", "items": [f"c{i}" for i in range(10)], "template": "Say {item}", "mode": "batch"},
    {"name": "second", "kind": "prompt", "items_from": {"stage": "first", "results": True}, "template": "Again {item}"}]}


@pytest.mark.parametrize("door", ["cli", "api"])
def test_canceling_a_pipeline_whose_stage_waits_at_the_provider_says_what_the_provider_said(
        conn, workers, model_server, env, door):
    server = batch_settings(env, model_server)
    made = pipelines.submit(conn, pipelines.read(BODY, "shared"), submission)
    first, second = (job_id for _, job_id in made.stages)
    workers.start()
    waiting(conn, first)
    only_batch(server)
    if door == "cli":
        out = CliRunner().invoke(main, ["pipeline", "cancel", "--json", made.pipeline_id])
        assert out.exit_code == 0, out.output
        rows = json.loads(out.output)["stages"]
        assert rows[0]["text"] == "canceled, and its batch at the provider too" and "text" not in rows[1]
        text = CliRunner().invoke(main, ["pipeline", "cancel", made.pipeline_id]).output
        assert "first: had already failed" in text
    else:
        from tests.web_support import create_app_with

        answer = create_app_with().test_client().post(f"/pipelines/{made.pipeline_id}/cancel")
        assert answer.status_code == 202, answer.get_json()
        rows = answer.get_json()["stages"]
        assert rows[0]["provider_batch"]["canceled"] == rows[0]["provider_batch"]["batches"] != []
        assert "provider_batch" not in rows[1]
    assert [rows[0]["was"], rows[1]["was"]] == ["waiting", "queued"]
    for job_id in (first, second):
        assert states.status(conn, job_id)["canceled"]
