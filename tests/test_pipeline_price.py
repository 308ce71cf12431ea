"""A pipeline's dry run prices a stage fed by an earlier stage's *results* -- items no one knows
before that stage has run -- for as many items as its source has, each as long as an item may
be (LEASH_MAX_ITEM_CHARS, which the stage holds them to as it starts), at every door: the API,
`leash submit --pipeline --dry-run`, and Python. Real runs against the stand-in provider bill
no stage, and no pipeline, past that worst case."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from cli import main
from jobs import kinds
from jobs.enqueue import enqueue
from jobs.intake import pipelines, submission
from jobs.intake.estimate import WIDEST_CHARACTER
from jobs.models.calls import ModelSettings
from tests.test_extract import SCHEMA
from tests.test_items_workers import ended
from tests.test_usage_workers import billed

PRICES = '{"fake-model": {"input": 1.0, "output": 2.0}}'  # dollars per million tokens
REVIEWS = [f"review {i:02d} of gadget{i} -> {'negative' if i % 3 == 0 else 'positive'}" for i in range(30)]
NEGATIVE = [review for review in REVIEWS if review.endswith("negative")]
THREE_STAGES = {"name": "complaints", "stages": [
    {"name": "classify", "kind": "classify", "items": REVIEWS, "labels": ["positive", "negative"]},
    {"name": "complaints", "kind": "extract", "schema": SCHEMA, "items_from": {"stage": "classify", "label": "negative"}},
    {"name": "replies", "kind": "prompt", "template": "Write a reply to this complaint: {item}",
     "items_from": {"stage": "complaints", "results": True}}]}
OWNER = "shared"  # the API's and the command line's owner without LEASH_API_TOKENS


def dry_run(conn, body: dict) -> dict:
    return pipelines.submit(conn, pipelines.read(body, OWNER), submission, dry_run=True).estimate


def worst_tokens(figures: dict) -> int:
    return figures["input_tokens"] + figures["output_tokens_max"]


def test_a_stage_fed_by_results_is_priced_for_every_item_of_its_source_each_as_long_as_an_item_may_be(
        conn, model_server, env, client, tmp_path):
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    api = client.post("/pipelines", json={**THREE_STAGES, "dry_run": True})
    assert api.status_code == 200, api.get_json()
    estimate = api.get_json()["estimate"]
    path = tmp_path / "complaints.yaml"
    path.write_text(yaml.safe_dump(THREE_STAGES))
    words = CliRunner().invoke(main, ["submit", "--pipeline", str(path), "--dry-run"])
    as_json = CliRunner().invoke(main, ["submit", "--pipeline", str(path), "--dry-run", "--json"])
    assert words.exit_code == 0 and as_json.exit_code == 0, (words.output, as_json.output)
    print(words.stdout)
    replies = estimate["stages"][2]
    # Every door the same figures: the API's, the command line's and Python's.
    assert json.loads(as_json.stdout)["estimate"]["stages"][2]["estimate"] == replies["estimate"]
    assert dry_run(conn, THREE_STAGES)["stages"][2]["estimate"] == replies["estimate"]
    assert replies["priced_at"] == (f"the results of all {len(REVIEWS)} items of stage 'complaints': at most "
                                    f"{len(REVIEWS)} items, each up to LEASH_MAX_ITEM_CHARS (10,000) characters "
                                    "(worst case; the expected cost is unknown until it starts)")
    assert replies["priced_at"] in words.stdout and "items assumed, not yet known" in words.stdout
    # Its worst case: that many calls, each with an item of 10,000 characters of four bytes.
    settings = ModelSettings.from_env()
    one = kinds.get("prompt").batch.request(THREE_STAGES["stages"][2], WIDEST_CHARACTER * 10_000, settings.max_tokens)
    figures = replies["estimate"]
    assert figures["items"] == figures["calls"] == len(REVIEWS) and figures["items_assumed"]
    assert figures["input_tokens"] == len(REVIEWS) * one.input_bound() and one.input_bound() > 40_000
    assert figures["output_tokens_max"] == len(REVIEWS) * settings.max_tokens
    assert figures["cost_usd_max"] > 0 and figures["cost_usd_expected"] is None
    # And the pipeline's sums count it (no stage left at none).
    assert estimate["calls"] == 3 * len(REVIEWS)
    assert estimate["input_tokens"] == sum(s["estimate"]["input_tokens"] for s in estimate["stages"])
    assert estimate["cost_usd_max"] == pytest.approx(sum(s["estimate"]["cost_usd_max"] for s in estimate["stages"]))
    assert not conn.keys("leash:job:*") and not conn.keys("leash:pipeline:*")


@pytest.mark.slow
def test_no_stage_of_a_real_run_bills_past_its_dry_runs_worst_case(conn, burst, model_server, env):
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    estimate = dry_run(conn, THREE_STAGES)
    submitted = pipelines.submit(conn, pipelines.read(THREE_STAGES, OWNER), submission)
    burst()
    spent = []
    for (name, job_id), priced in zip(submitted.stages, estimate["stages"], strict=True):
        final = ended(conn, job_id)
        assert final["state"] == "succeeded", (name, final["error"])
        usage, worst = final["usage"], priced["estimate"]
        spent.append((usage["input_tokens"] + usage["output_tokens"], final["cost_usd"]))
        print(f"{name}: {final['total']} items, {usage['calls']} calls; billed {spent[-1][0]:,} tokens "
              f"(${spent[-1][1]:.6f}); dry run worst case {worst_tokens(worst):,} tokens (${worst['cost_usd_max']:.6f})"
              f", priced at {priced['priced_at'] or 'its own items'}")
        assert usage["input_tokens"] <= worst["input_tokens"] and usage["output_tokens"] <= worst["output_tokens_max"]
        assert spent[-1][1] <= worst["cost_usd_max"]
    assert [ended(conn, job_id)["total"] for _, job_id in submitted.stages] == [len(REVIEWS), len(NEGATIVE),
                                                                                len(NEGATIVE)]
    calls, prompt_tokens, completion_tokens = billed(model_server)
    total_cost = sum(cost for _, cost in spent)
    print(f"pipeline: billed {prompt_tokens + completion_tokens:,} tokens (${total_cost:.6f}) in {calls} calls; "
          f"dry run worst case {worst_tokens(estimate):,} tokens (${estimate['cost_usd_max']:.6f})")
    assert sum(tokens for tokens, _ in spent) == prompt_tokens + completion_tokens  # what the stand-in billed
    assert prompt_tokens + completion_tokens <= worst_tokens(estimate) and total_cost <= estimate["cost_usd_max"]


@pytest.mark.slow
def test_results_in_a_script_of_more_bytes_a_character_stay_within_the_worst_case(conn, burst, model_server, env):
    """Answers of 394 kanji each (the stand-in bills 2 tokens a character, a real tokenizer 1-3):
    within LEASH_MAX_ITEM_CHARS, but more tokens than as many ASCII characters have bytes -- the
    price counts every character at four bytes, the most one has."""
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    env.setenv("LEASH_MAX_ITEM_CHARS", "400")
    kanji = "\u6f22" * 393  # each item "q0 -> 0" and these: 400 characters; each answer "0" and these
    body = {"stages": [
        {"name": "answers", "kind": "prompt", "template": "{item}", "items": [f"q{n} -> {n}{kanji}" for n in range(5)]},
        {"name": "again", "kind": "prompt", "template": "{item}", "items_from": {"stage": "answers", "results": True}}]}
    estimate = dry_run(conn, body)
    submitted = pipelines.submit(conn, pipelines.read(body, OWNER), submission)
    burst()
    again = ended(conn, submitted.stages[1][1])
    worst = estimate["stages"][1]["estimate"]
    ascii_bound = 5 * kinds.get("prompt").batch.request(body["stages"][1], "x" * 400, 1).input_bound()
    print(f"again: billed {again['usage']['input_tokens']:,} input tokens; dry run worst case {worst['input_tokens']:,} "
          f"(items of ASCII characters would have said {ascii_bound:,})")
    assert again["state"] == "succeeded" and again["item_errors"] == 0 and again["usage"]["calls"] == 5
    assert ascii_bound < again["usage"]["input_tokens"] <= worst["input_tokens"]
    assert again["cost_usd"] <= worst["cost_usd_max"]


def test_a_stage_fed_by_a_stage_fed_by_results_is_bounded_by_the_first_source(conn, model_server, env):
    body = {"stages": [*THREE_STAGES["stages"],
                       {"name": "follow_up", "kind": "prompt", "template": "Again: {item}",
                        "items_from": {"stage": "replies"}},  # the replies' inputs: complaints' results
                       {"name": "summary", "kind": "reduce", "instruction": "Summarise",
                        "items_from": {"stage": "follow_up", "results": True}},
                       {"name": "shout", "kind": "prompt", "template": "{item}!",
                        "items_from": {"stage": "summary", "results": True}}]}
    stages = dry_run(conn, body)["stages"]
    follow_up, summary, shout = stages[3], stages[4], stages[5]
    print(follow_up["priced_at"], "|", shout["priced_at"])
    assert follow_up["priced_at"].startswith(f"all the items of stage 'replies', not known before it runs: at most "
                                             f"{len(REVIEWS)} items, each up to LEASH_MAX_ITEM_CHARS")
    assert follow_up["estimate"]["calls"] == len(REVIEWS) and follow_up["estimate"]["items_assumed"]
    assert summary["estimate"]["items"] == len(REVIEWS) and summary["estimate"]["items_assumed"]
    assert shout["priced_at"].startswith("the one result of stage 'summary': at most 1 item, each up to")
    assert shout["estimate"]["calls"] == 1


def test_a_stage_fed_by_a_job_that_has_not_started_is_bounded_by_that_jobs_own_source(conn, model_server, env):
    first, _ = enqueue(conn, "classify", {"items": REVIEWS, "labels": ["positive", "negative"]}, owner=OWNER)
    waiting, _ = enqueue(conn, "prompt", {"items_from": {"job": first, "label": "negative", "results": True},
                                          "template": "{item}"}, owner=OWNER)
    body = {"stages": [{"name": "again", "kind": "prompt", "template": "Again: {item}",
                        "items_from": {"job": waiting, "results": True}}]}
    stage = dry_run(conn, body)["stages"][0]
    assert stage["priced_at"].startswith(f"the results of all {len(REVIEWS)} items of job {waiting}: at most "
                                         f"{len(REVIEWS)} items")
    assert stage["estimate"]["calls"] == len(REVIEWS)
    # Its inputs (no "results"): the labels it will be given are not known yet either.
    inputs = dry_run(conn, {"stages": [{**body["stages"][0], "items_from": {"job": waiting}}]})["stages"][0]
    assert inputs["priced_at"].startswith(f"all the items of job {waiting}, not known before it runs: at most "
                                          f"{len(REVIEWS)} items")


def test_a_stage_whose_items_nothing_bounds_has_no_worst_case_and_neither_has_the_pipeline(conn, model_server, env):
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    theirs, _ = enqueue(conn, "classify", {"items": REVIEWS, "labels": ["positive", "negative"]}, owner="someone")
    body = {"stages": [THREE_STAGES["stages"][0],
                       {"name": "again", "kind": "prompt", "template": "{item}",
                        "items_from": {"job": theirs, "results": True}}]}
    estimate = dry_run(conn, body)
    stage = estimate["stages"][1]
    assert stage["priced_at"] == f"no bound on its items (job {theirs} is not a job of yours that Redis holds): " \
                                 "no worst case"
    assert stage["estimate"]["input_tokens"] is None and stage["estimate"]["cost_usd_max"] is None
    assert estimate["input_tokens"] is None and estimate["cost_usd_max"] is None
    assert str(len(REVIEWS)) not in stage["priced_at"]  # nothing of another owner's job is told
