"""A pipeline on real `leash worker` processes against the stand-in provider: classify 100
reviews, extract a schema from the negative ones, reduce those into one summary. Stage 2 starts within 2 s of stage 1's end and
reads only the negative items; the dry run's worst case holds what it cost; a SIGKILL of the
worker during stage 2 resumes it from its checkpoint, no answer billed twice; the same pipeline
again (through the API this time) makes no model call; canceling a pipeline cancels every stage."""

from __future__ import annotations

import json
import os
import signal
from datetime import datetime

import pytest
import yaml
from click.testing import CliRunner

from cli import main
from jobs.core import states
from jobs.intake import pipelines, submission
from jobs.read import pipeline_view, results
from tests.conftest import wait_for
from tests.test_extract import SCHEMA
from tests.test_items_workers import stored
from tests.web_support import create_app_with

pytestmark = pytest.mark.slow

REVIEWS = [f"review {i:03d} of gadget{i} -> {'negative' if i % 3 == 0 else 'positive'}" for i in range(100)]
NEGATIVE = [review for review in REVIEWS if review.endswith("negative")]
CONCURRENCY = 2


def pipeline_body() -> dict:
    return {"name": "reviews", "stages": [
        {"name": "classify", "kind": "classify", "items": REVIEWS, "labels": ["positive", "negative"]},
        {"name": "complaints", "kind": "extract", "schema": SCHEMA,
         "items_from": {"stage": "classify", "label": "negative"}},
        {"name": "summary", "kind": "reduce", "instruction": "Summarise the complaints in three lines",
         "items_from": {"stage": "complaints", "results": True}}]}


def ended_pipeline(conn, pipeline_id: str, timeout: float = 120) -> dict:
    return wait_for(lambda: (s := pipeline_view.status(conn, pipeline_view.read_record(conn, pipeline_id)))["ended"]
                    and s, timeout, message=f"pipeline {pipeline_id} to end")


def at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_the_reviews_pipeline_from_one_command_killed_in_stage_2_then_again_from_one_api_call(
        conn, workers, model_server, env, tmp_path):
    env.setenv("LEASH_ITEM_CONCURRENCY", str(CONCURRENCY))
    model_server.latency = 0.15
    path = tmp_path / "reviews.yaml"
    path.write_text(yaml.safe_dump(pipeline_body()))
    dry = CliRunner().invoke(main, ["submit", "--pipeline", str(path), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    estimate = json.loads(dry.stdout)["estimate"]

    answer = CliRunner().invoke(main, ["submit", "--pipeline", str(path), "--json"])  # one command
    assert answer.exit_code == 0, answer.output
    submitted = json.loads(answer.stdout)
    classify, complaints, summary = (stage["job_id"] for stage in submitted["stages"])
    first = workers.start("--no-scheduler")
    wait_for(lambda: states.status(conn, classify)["state"] == "succeeded", 90, message="stage 1 to succeed")
    wait_for(lambda: states.status(conn, complaints)["done"] >= 6, 60, message="stage 2 under way")
    before_kill = states.status(conn, complaints)
    delay = at(before_kill["started_at"]) - at(states.status(conn, classify)["finished_at"])
    horse = workers.horse(first)
    os.kill(first.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    stored_at_kill = set(stored(conn, complaints))
    workers.start("--no-scheduler")
    status = ended_pipeline(conn, submitted["pipeline_id"])

    stage2 = states.status(conn, complaints)
    read = results.submitted_items(conn, complaints)
    # Stage 2's requests are the ones with a schema (classify's have none).
    asked = [seen.item for seen in model_server.requests if seen.item and "response_format" in seen.body]
    extract_calls = {item: sum(1 for seen in asked if item in seen) for item in NEGATIVE}
    billed_twice = sum(1 for item in NEGATIVE if extract_calls[item] > 1)
    cost = len(model_server.billed)
    print(f"stage 2 started {delay:.3f} s after stage 1 ended; read {len(read)} items ({len(NEGATIVE)} negative); "
          f"killed at {len(stored_at_kill)} stored, resumed at attempt {stage2['attempts']}; "
          f"{billed_twice} items asked twice; {cost} answers billed; dry run worst case "
          f"{estimate['input_tokens'] + estimate['output_tokens_max']:,} tokens, used {status['usage']['tokens']:,}")
    assert status["state"] == "succeeded", status
    # Started by the first stage's end (RQ's dependents), not by a later sweep: seconds, even on a
    # loaded machine (0.016-0.021 s on a quiet one; the figure is printed above).
    assert delay < 10.0
    assert read == NEGATIVE and stage2["total"] == len(NEGATIVE) and stage2["done"] == len(NEGATIVE)
    assert stage2["attempts"] == 2 and stored_at_kill and len(stored_at_kill) < len(NEGATIVE)
    assert billed_twice <= CONCURRENCY  # only the calls in flight at the kill could be asked again
    assert len(REVIEWS) + len(NEGATIVE) <= cost <= len(REVIEWS) + len(NEGATIVE) + CONCURRENCY
    assert not any(extract_calls[NEGATIVE[i]] > 1 for i in stored_at_kill), "a stored item was asked again"
    assert status["usage"]["tokens"] <= estimate["input_tokens"] + estimate["output_tokens_max"]
    reduced = states.status(conn, summary)
    answer = [result for _, _, result, _ in results.iter_results(conn, summary)]
    print(f"stage 3 (reduce): {reduced['usage']['calls']} calls, answer {str(answer)[:80]}")
    assert reduced["state"] == "succeeded" and len(answer) == 1 and answer[0]

    # The same pipeline again, from one API call: the request cache answers every request.
    requests_before = len(model_server.requests)
    client = create_app_with().test_client()
    again = client.post("/pipelines", json=pipeline_body())
    assert again.status_code == 202, again.get_json()
    rerun = ended_pipeline(conn, again.get_json()["pipeline_id"])
    print(f"re-run: {len(model_server.requests) - requests_before} model calls, "
          f"{sum((s['usage'] or {}).get('cache_hits', 0) for s in rerun['stages'])} cache hits")
    assert rerun["state"] == "succeeded" and len(model_server.requests) == requests_before
    assert rerun["stages"][1]["total"] == len(NEGATIVE)


def test_canceling_the_pipeline_cancels_every_stage_running_or_waiting(conn, workers, model_server, env):
    model_server.latency = 0.3
    env.setenv("LEASH_ITEM_CONCURRENCY", "1")
    submitted = pipelines.submit(conn, pipelines.read(pipeline_body(), "shared"), submission)
    classify, complaints, summary = (job_id for _, job_id in submitted.stages)
    workers.start("--no-scheduler")
    wait_for(lambda: states.status(conn, classify)["done"] >= 2, 60, message="stage 1 under way")
    client = create_app_with().test_client()
    response = client.post(f"/pipelines/{submitted.pipeline_id}/cancel")
    assert response.status_code == 202
    assert [s["was"] for s in response.get_json()["stages"]] == ["running", "queued", "queued"]
    status = ended_pipeline(conn, submitted.pipeline_id, timeout=30)
    print(f"canceled: {[(s['name'], s['state'], s['canceled'], s['done']) for s in status['stages']]}")
    assert status["canceled"] and all(s["state"] == "failed" and s["canceled"] for s in status["stages"])
    assert states.status(conn, complaints)["done"] == 0 and states.status(conn, summary)["done"] == 0  # never ran
