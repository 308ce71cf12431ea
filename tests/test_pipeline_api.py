"""Pipelines over HTTP: several stage jobs in one POST /pipelines, their status, their page, one
dry run, one cancel for every stage; a stage refused refuses the whole pipeline."""

from __future__ import annotations

import pytest

from jobs import keys
from jobs.core import states
from jobs.read import results
from tests.web_support import bearer

REVIEWS = ["good film", "bad film", "great cast", "awful plot, bad acting", "fine photography"]
PIPELINE = {"name": "reviews", "stages": [
    {"name": "classify", "kind": "classify", "items": REVIEWS, "labels": ["positive", "negative"]},
    {"name": "shout", "kind": "count", "delay": 0, "items_from": {"stage": "classify", "label": "negative"}},
    {"name": "again", "kind": "count", "delay": 0, "items_from": {"stage": "shout"}, "after": ["classify"]},
]}


def submitted(client, body=PIPELINE, **kwargs):
    response = client.post("/pipelines", json=body, **kwargs)
    assert response.status_code == 202, response.get_json()
    return response.get_json()


def test_one_post_writes_every_stage_as_a_job_that_knows_its_pipeline(client, conn):
    body = submitted(client)
    assert body["url"] == f"/pipelines/{body['pipeline_id']}"
    names = [stage["name"] for stage in body["stages"]]
    assert names == ["classify", "shout", "again"]
    classify, shout, again = (stage["job_id"] for stage in body["stages"])
    assert body["stages"][1]["url"] == f"/jobs/{shout}"
    for job_id in (classify, shout, again):
        assert states.status(conn, job_id)["pipeline"] == body["pipeline_id"]
    # Later stages name earlier ones by their job ids: items_from and an implicit after.
    assert states.status(conn, shout)["after"] == {"jobs": [classify], "policy": "cancel"}
    assert set(states.status(conn, again)["after"]["jobs"]) == {classify, shout}
    assert states.status(conn, classify)["name"] == "reviews: classify"
    assert conn.ttl(keys.pipeline(body["pipeline_id"])) > 0


def test_the_stages_run_in_order_and_the_status_follows_them(client, conn, burst):
    body = submitted(client)
    status = client.get(body["url"]).get_json()
    assert status["state"] == "queued" and status["deciding_stage"] == "classify" and not status["ended"]
    assert [stage["state"] for stage in status["stages"]] == ["queued"] * 3
    burst()
    status = client.get(body["url"]).get_json()
    assert status["state"] == "succeeded" and status["ended"] and status["deciding_stage"] is None
    classify, shout, again = (stage["job_id"] for stage in body["stages"])
    labels = {item: result for _, item, result, _ in results.iter_results(conn, classify)}
    negative = [review for review in REVIEWS if labels[review] == "negative"]
    assert negative and status["stages"][1]["total"] == len(negative) == status["stages"][2]["total"]
    assert [item for _, item, _, _ in results.iter_results(conn, shout)] == negative


@pytest.mark.parametrize("body, status, message", [
    ({"stages": []}, 400, "missing field 'stages'"),
    ({"stages": [{"name": "a", "kind": "classify", "items": ["x"]}]}, 422, "stage 'a': 'labels' must be"),
    ({"stages": [{"name": "a", "kind": "classify", "items": ["x"], "labels": ["p"]},
                 {"name": "b", "kind": "count", "items": []}]}, 422, "stage 'b': 'items' is empty"),
    ({"stages": [{"name": "a", "kind": "count", "items_from": {"stage": "b"}},
                 {"name": "b", "kind": "count", "items": ["x"]}]}, 422, "stage 'a': 'items_from' names stage 'b'"),
    ({"stages": [{"name": "a", "kind": "count", "items": ["x"], "after": ["b"]},
                 {"name": "b", "kind": "count", "items": ["x"]}]}, 422, "'after' names stage 'b', which does not"),
    ({"stages": [{"name": "a", "kind": "count", "items": ["x"]}, {"name": "a", "kind": "count", "items": ["x"]}]},
     422, "two stages have this name"),
    ({"stages": [{"name": "a", "kind": "count", "items": ["x"]},
                 {"name": "b", "kind": "count", "items": ["y"], "after_policy": "run"}]},
     422, "stage 'b': 'after_policy' needs 'after'"),
    ({"stages": [{"name": "a b", "kind": "count", "items": ["x"]}]}, 422, "'name' must be 1-40 letters"),
    ({"stages": [{"name": "a", "kind": "nope", "items": ["x"]}]}, 422, "stage 'a': unknown kind 'nope'"),
    ({"stages": [{"name": "a", "kind": "count", "items": ["x"]}], "colour": 1}, 422, "no field 'colour'"),
    ({"stages": [{"name": "a", "kind": "count", "items": ["x"]}], "budget": {"tokens": 0}}, 422,
     "the pipeline's 'budget'.tokens must be"),
])
def test_a_stage_refused_refuses_the_pipeline_naming_it_and_nothing_is_written(client, conn, body, status, message):
    response = client.post("/pipelines", json=body)
    assert response.status_code == status, response.get_json()
    assert message in response.get_json()["error"]
    assert not conn.keys("leash:job:*") and not conn.keys("leash:pipeline:*")


@pytest.mark.parametrize("second, budget", [
    ({"items_from": {"stage": "a"}, "after_policy": "run"}, None),  # it waits for the stage it reads
    ({"items": ["y"], "after_policy": "wait"}, {"tokens": 1000}),  # a budgeted pipeline: one stage at a time
])
def test_a_stages_after_policy_is_taken_when_it_waits_for_a_stage_without_an_after_of_its_own(client, conn, second,
                                                                                              budget):
    body = {"stages": [{"name": "a", "kind": "count", "items": ["x"]}, {"name": "b", "kind": "count", **second}]}
    answer = submitted(client, body | ({"budget": budget} if budget else {}))
    a, b = (stage["job_id"] for stage in answer["stages"])
    assert states.status(conn, b)["after"] == {"jobs": [a], "policy": second["after_policy"]}


def test_a_repeat_with_the_same_idempotency_key_is_the_same_pipeline(client, conn):
    first = client.post("/pipelines", json=PIPELINE, headers={"Idempotency-Key": "batch-7"})
    again = client.post("/pipelines", json=PIPELINE, headers={"Idempotency-Key": "batch-7"})
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.get_json() == again.get_json()
    assert len(conn.keys("leash:job:*")) == 3


def test_the_dry_run_prices_every_stage_and_writes_nothing(client, conn):
    response = client.post("/pipelines", json={**PIPELINE, "dry_run": True})
    assert response.status_code == 200, response.get_json()
    estimate = response.get_json()["estimate"]
    assert [stage["name"] for stage in estimate["stages"]] == ["classify", "shout", "again"]
    # Fed by classify: priced at all of its items, the worst case, and said so.
    assert estimate["stages"][1]["estimate"]["items"] == len(REVIEWS)
    assert "worst case" in estimate["stages"][1]["priced_at"] and "worst case" in estimate["note"]
    assert estimate["items"] == 3 * len(REVIEWS)
    assert not conn.keys("leash:job:*") and not conn.keys("leash:pipeline:*")


def test_cancel_cancels_every_stage_queued_or_waiting(client, conn):
    body = submitted(client)
    response = client.post(f"{body['url']}/cancel")
    assert response.status_code == 202
    assert [stage["canceled"] for stage in response.get_json()["stages"]] == [True, True, True]
    status = client.get(body["url"]).get_json()
    assert status["state"] == "failed" and status["canceled"] and status["ended"]
    assert all(stage["state"] == "failed" and stage["canceled"] for stage in status["stages"])


def test_the_page_shows_each_stage_with_its_link_and_the_job_page_links_back(client, conn, burst):
    body = submitted(client)
    page = client.get(body["url"], headers={"Accept": "text/html"})
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    for stage in body["stages"]:
        assert f'id="stage-{stage["name"]}"' in html and f'href="/jobs/{stage["job_id"]}"' in html
    assert 'id="cancel-button"' in html and "job.js" in html and "reviews" in html
    job_page = client.get(body["stages"][1]["url"], headers={"Accept": "text/html"}).get_data(as_text=True)
    assert f'href="/pipelines/{body["pipeline_id"]}"' in job_page
    burst()
    html = client.get(body["url"], headers={"Accept": "text/html"}).get_data(as_text=True)
    assert 'id="cancel-button"' not in html and "job.js" not in html and "succeeded" in html


def test_another_owners_pipeline_is_a_404_like_an_unknown_one(conn, token_app):
    client = token_app.test_client()
    body = submitted(client, headers=bearer("alice"))
    for path in (body["url"], "/pipelines/nope"):
        assert client.get(path, headers=bearer("bob")).status_code == 404
    assert client.post(f"{body['url']}/cancel", headers=bearer("bob")).status_code == 404
    assert client.get(body["url"], headers=bearer("alice")).status_code == 200
    assert all(states.status(conn, s["job_id"])["state"] == "queued" for s in body["stages"])


def test_the_dry_run_prices_a_reduce_stage_for_every_result_of_the_stage_before_it(client, conn):
    body = {"stages": [PIPELINE["stages"][0],
                       {"name": "summary", "kind": "reduce", "instruction": "Summarise",
                        "items_from": {"stage": "classify", "results": True}}], "dry_run": True}
    response = client.post("/pipelines", json=body)
    assert response.status_code == 200, response.get_json()
    stage = response.get_json()["estimate"]["stages"][1]
    assert stage["estimate"]["items"] == len(REVIEWS) and stage["estimate"]["items_assumed"]
    assert stage["priced_at"].startswith(f"the results of all {len(REVIEWS)} items of stage 'classify'")


def test_a_stage_refused_at_the_door_cancels_those_written_and_a_retry_makes_new_jobs(client, conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "2")  # room for two of the three stages
    response = client.post("/pipelines", json=PIPELINE, headers={"Idempotency-Key": "full-1"})
    assert response.status_code == 429 and "LEASH_MAX_QUEUED_PER_OWNER" in response.get_json()["error"]
    written = [key.decode().split(":")[-1] for key in conn.keys("leash:job:*")]
    assert len(written) == 2 and all(states.status(conn, job_id)["canceled"] for job_id in written)
    assert not conn.keys("leash:pipeline:*") and not conn.keys("leash:idem*")
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "10")
    again = submitted(client, headers={"Idempotency-Key": "full-1"})
    assert not {stage["job_id"] for stage in again["stages"]} & set(written)


def test_a_long_idempotency_key_still_keys_every_stage(client, conn):
    key = "k" * 200
    first = client.post("/pipelines", json=PIPELINE, headers={"Idempotency-Key": key})
    again = client.post("/pipelines", json=PIPELINE, headers={"Idempotency-Key": key})
    assert (first.status_code, again.status_code) == (202, 200) and first.get_json() == again.get_json()


def test_the_list_shows_the_callers_pipelines_newest_first_and_only_theirs(conn, token_app):
    client = token_app.test_client()
    first = submitted(client, headers=bearer("alice"))
    second = submitted(client, body={**PIPELINE, "name": "later"}, headers=bearer("alice"))
    submitted(client, headers=bearer("bob"))
    listed = client.get("/pipelines?limit=1", headers=bearer("alice")).get_json()
    assert listed["total"] == 2 and [p["pipeline_id"] for p in listed["pipelines"]] == [second["pipeline_id"]]
    assert listed["pipelines"][0]["name"] == "later" and listed["next"] == "/pipelines?offset=1&limit=1"
    rest = client.get(listed["next"], headers=bearer("alice")).get_json()
    assert [p["pipeline_id"] for p in rest["pipelines"]] == [first["pipeline_id"]] and rest["next"] is None
    conn.delete(keys.pipeline(first["pipeline_id"]))  # expired: it leaves the list
    assert client.get("/pipelines", headers=bearer("alice")).get_json()["total"] == 1


def _charge(conn, job_id, nusd, unpriced=0):
    conn.hset(keys.job(job_id), mapping={"usage_calls": 1, "usage_cost_nusd": nusd, "usage_unpriced_calls": unpriced})


def test_the_pipelines_cost_is_the_sum_of_its_stages_costs_to_the_last_digit_they_show(client, conn):
    body = submitted(client)
    for stage, nusd in zip(body["stages"], (1_234_567, 2_345_678, 3_456_789), strict=True):
        _charge(conn, stage["job_id"], nusd)
    status = client.get(body["url"]).get_json()
    stage_costs = [stage["cost_usd"] for stage in status["stages"]]
    assert stage_costs == [0.00123457, 0.00234568, 0.00345679]
    assert status["cost_usd"] == round(sum(stage_costs), 8) == 0.00703704


def test_a_pipeline_with_a_stage_of_unknown_cost_has_an_unknown_cost_not_a_partial_sum(client, conn):
    body = submitted(client)
    _charge(conn, body["stages"][0]["job_id"], 5_000_000)
    _charge(conn, body["stages"][1]["job_id"], 0, unpriced=1)
    status = client.get(body["url"]).get_json()
    assert status["stages"][1]["cost_usd"] is None
    assert status["cost_usd"] is None


def test_the_dry_runs_sums_keep_every_digit_of_the_stages_figures():
    from jobs.intake import pipeline_price

    stage = {"items": 1, "calls": 1, "cached_items": 0, "input_tokens": 10, "output_tokens_max": 5,
             "cost_usd_max": 0.00000042, "cost_usd_batch_max": 0.00000021, "cost_usd_expected": 0.00000013}
    summed = pipeline_price._summed([{"estimate": stage}] * 3, None)
    assert summed["cost_usd_max"] == 0.00000126 and summed["cost_usd_batch_max"] == 0.00000063
    assert summed["cost_usd_expected"] == 0.00000039


def test_the_same_submission_twice_at_once_is_one_pipeline_whose_stages_all_name_it(conn):
    import threading

    from jobs.intake import pipelines, submission

    body = {"budget": {"tokens": 100_000}, "stages": [
        {"name": f"s{n}", "kind": "prompt", "items": [f"x{n}"], "template": "{item}"} for n in range(12)]}
    for trial in range(10):
        answers = []

        def submit(key=f"retry-{trial}", answers=answers):
            answers.append(pipelines.submit(conn, pipelines.read(body, "dana", key), submission))

        racing = [threading.Thread(target=submit) for _ in range(2)]
        for thread in racing:
            thread.start()
        for thread in racing:
            thread.join(30)
        assert len(answers) == 2 and answers[0].pipeline_id == answers[1].pipeline_id
        assert answers[0].stages == answers[1].stages and sorted(a.created for a in answers) == [False, True]
        # Every stage knows the pipeline the answer names: its page's link, and its budget, hold.
        named = {states.status(conn, job_id)["pipeline"] for _, job_id in answers[0].stages}
        assert named == {answers[0].pipeline_id}, f"trial {trial}: stages name {named}"


@pytest.mark.parametrize("stage, message", [
    ({"budget": {"tokens": True}}, "stage 'a': 'budget'.tokens must be"),
    ({"bogus": 1}, "'template', 'max_item_errors', 'item_concurrency', 'budget', 'mode', 'cache', 'items_from'"),
])
def test_a_stages_refusal_reads_as_one_sentence_naming_each_field_once(client, stage, message):
    body = {"budget": {"tokens": 10}, "stages": [{"name": "a", "kind": "prompt", "items": ["x"], "template": "{item}",
                                                  **stage}]}
    response = client.post("/pipelines", json=body)
    assert response.status_code == 422 and message in response.get_json()["error"], response.get_json()
