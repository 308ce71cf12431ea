"""A job's items from another job's results (``items_from``): chosen by label, field value or
error, read as the job starts (never copied at submission), from whichever store holds them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jobs.core import states
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob
from jobs.read import results, selection
from tests.conftest import REDIS_URL, ROOT

REVIEWS = ["good film", "bad film", "great cast", "awful plot, bad acting", "fine photography"]


def classified(conn, burst):
    parent, _ = enqueue(conn, "classify", {"items": REVIEWS, "labels": ["positive", "negative"]})
    return parent


def answers(conn, job_id):
    return [(item, result) for _, item, result, _ in results.iter_results(conn, job_id)]


def test_a_child_takes_the_items_its_parent_labeled_negative_when_it_starts(conn, burst):
    parent = classified(conn, burst)
    child, _ = enqueue(conn, "count", {"items_from": {"job": parent, "label": "negative"}, "delay": 0})
    status = states.status(conn, child)
    assert status["state"] == "queued" and status["after"] == {"jobs": [parent], "policy": "cancel"}
    assert status["total"] == 0  # not read yet: the parent has not run
    burst()
    labels = dict(answers(conn, parent))
    negative = [review for review in REVIEWS if labels[review] == "negative"]
    assert negative and len(negative) < len(REVIEWS)
    assert answers(conn, child) == [(review, review.upper()) for review in negative]
    assert states.status(conn, child)["state"] == "succeeded" and states.status(conn, child)["total"] == len(negative)


def test_all_of_a_parents_items_and_a_selection_that_matches_none(conn, burst):
    parent = classified(conn, burst)
    every, _ = enqueue(conn, "count", {"items_from": {"job": parent}, "delay": 0})
    none, _ = enqueue(conn, "count", {"items_from": {"job": parent, "label": "neutral"}, "delay": 0})
    burst()
    assert [item for item, _ in answers(conn, every)] == REVIEWS
    assert states.status(conn, none)["state"] == "succeeded" and states.status(conn, none)["total"] == 0


def test_the_items_are_read_when_the_child_starts_not_at_submission(conn, burst):
    parent, _ = enqueue(conn, "count", {"items": ["a", "b"], "delay": 0})
    child, _ = enqueue(conn, "count", {"items_from": parent, "delay": 0})
    assert results.submitted_items(conn, child) == []  # nothing copied at submission
    burst()
    assert results.submitted_items(conn, child) == ["a", "b"]


@pytest.mark.parametrize("result, chosen_by", [
    ("negative", {"label": "negative"}), ({"sentiment": "negative", "n": 2}, {"field": "sentiment", "value": "negative"}),
    ({"n": 2}, {"field": "n", "value": 2}), ({"error": "off-label answer"}, {"errored": True}),
])
def test_each_way_of_choosing(result, chosen_by):
    chooser = selection.parse({"job": "j", **chosen_by})
    assert selection.chosen(chooser, result)
    assert not selection.chosen(chooser, "positive")
    if not chooser.get("errored"):
        assert not selection.chosen(chooser, {"error": "x", "sentiment": "negative", "n": 2})


@pytest.mark.parametrize("text, parsed", [
    ("J1", {"job": "J1"}), ("J1:label=negative", {"job": "J1", "label": "negative"}),
    ("J1:errored", {"job": "J1", "errored": True}), ("J1:sentiment=bad", {"job": "J1", "field": "sentiment", "value": "bad"}),
    ("J1:results", {"job": "J1", "results": True}),
    ("J1:results:label=negative", {"job": "J1", "results": True, "label": "negative"}),
    ("J1:results:errored", {"job": "J1", "results": True, "errored": True}),
    ("J1:results=x", {"job": "J1", "field": "results", "value": "x"}),  # a field named results, as before
])
def test_the_command_lines_form(text, parsed):
    assert selection.from_text(text) == parsed


@pytest.mark.parametrize("body, message", [
    ({"items_from": {"job": "nope"}}, "no such job: nope"),
    ({"items_from": {"label": "x"}}, "'items_from' must be"),
    ({"items_from": {"job": "J", "label": "a", "errored": True}}, "one way"),
    ({"items_from": {"job": "J", "colour": "a"}}, "has no field 'colour'"),
    ({"items_from": {"job": "J", "results": "yes"}}, "results must be true"),
])
def test_items_from_is_checked_at_the_door(client, conn, body, message):
    response = client.post("/jobs", json={"kind": "classify", "labels": ["a", "b"], **body})
    assert response.status_code == 422 and message in response.get_json()["error"], response.get_json()


def test_items_and_items_from_together_are_refused(conn):
    parent, _ = enqueue(conn, "noop", {})
    with pytest.raises(InvalidJob, match="not both"):
        enqueue(conn, "count", {"items": ["a"], "items_from": parent})


def test_the_cli_takes_items_from_without_reading_its_source(conn, burst, env):
    parent = classified(conn, burst)
    run_env = {"PATH": "/usr/bin:/bin", "REDIS_URL": REDIS_URL, "LEASH_IMPORTS": "tests.kinds_for_tests",
               "PYTHONPATH": str(ROOT), "LEASH_OWNER": "default"}
    done = subprocess.run([sys.executable, "-m", "cli", "submit", "--kind", "count", "--items-from",
                           f"{parent}:label=negative"], env=run_env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    child = done.stdout.strip()
    burst()
    assert [item for item, _ in answers(conn, child)] == [r for r, label in answers(conn, parent) if label == "negative"]
    bad = subprocess.run([sys.executable, "-m", "cli", "submit", "--items-from", f"{parent}:label"], env=run_env,
                         cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert bad.returncode == 2 and "--items-from must be JOB" in bad.stderr


def test_results_true_takes_the_chosen_items_results_not_their_inputs(conn, burst):
    parent, _ = enqueue(conn, "extract", {"items": REVIEWS, "schema": {
        "type": "object", "properties": {"film": {"type": "string"}}, "required": ["film"],
        "additionalProperties": False}})
    labels = classified(conn, burst)
    burst()
    objects = [result for _, result in answers(conn, parent)]
    assert all(isinstance(value, dict) for value in objects)
    took = results.chosen_items(conn, {"job": parent, "results": True})
    assert took == [json.dumps(value, ensure_ascii=False) for value in objects]  # an object as its JSON
    negative = results.chosen_items(conn, {"job": labels, "label": "negative", "results": True})
    assert negative and set(negative) == {"negative"}  # text as it is
    assert results.chosen_items(conn, {"job": labels, "label": "negative"}) != negative  # the inputs, as before
    assert selection.describe({"job": "J", "results": True}) == "the results of the items of job J"


#: A small LEASH_MAX_ITEM_CHARS for the tests below: the stand-in answers "echo: <item>", six
#: characters longer than the item, so a result can pass a limit its input kept.
SMALL = 20
OVER = "longer than the 20 characters an item may have (LEASH_MAX_ITEM_CHARS): not asked"


def test_a_parents_result_longer_than_an_item_may_be_is_an_item_error_of_the_child_never_a_call(
        conn, burst, model_server, env):
    from tests.test_items_workers import calls_per_item, ended, stored

    env.setenv("LEASH_MAX_ITEM_CHARS", str(SMALL))
    inputs = ["short", "a much longer item"]  # 5 and 18 characters: both within the limit
    parent, _ = enqueue(conn, "prompt", {"items": inputs, "template": "{item}"})
    child, _ = enqueue(conn, "prompt", {"items_from": {"job": parent, "results": True}, "template": "{item}"})
    burst()
    assert [result for _, result in answers(conn, parent)] == ["echo: short", "echo: a much longer item"]
    final = ended(conn, child)
    print({k: final[k] for k in ("state", "outcome", "item_errors", "done", "total")}, calls_per_item(model_server))
    assert (final["state"], final["outcome"], final["item_errors"], final["total"]) == \
        ("succeeded", "succeeded_with_item_errors", 1, 2), final["error"]
    assert stored(conn, child) == {0: "echo: echo: short", 1: {"error": OVER}}
    # The stand-in was never sent the long one: one call for the child, for its short item.
    assert calls_per_item(model_server) == {"short": 1, "a much longer item": 1, "echo: short": 1}
    assert final["usage"]["calls"] == 1
    assert answers(conn, child)[1] == ("echo: a much longer item", {"error": OVER})  # the item beside its error


def test_a_label_selection_of_inputs_longer_than_todays_limit_counts_against_max_item_errors(
        conn, burst, model_server, env):
    from tests.test_items_workers import calls_per_item, ended

    long_review = "a rather long review text -> negative"  # accepted under the limit of its day
    parent, _ = enqueue(conn, "classify", {"items": ["ok -> negative", long_review, "good -> positive"],
                                           "labels": ["positive", "negative"]})
    env.setenv("LEASH_MAX_ITEM_CHARS", str(SMALL))  # lowered before the child starts
    child, _ = enqueue(conn, "prompt", {"items_from": {"job": parent, "label": "negative"}, "template": "{item}",
                                        "max_item_errors": 0})
    burst()
    assert ended(conn, parent)["outcome"] == "succeeded"  # limits apply at the door only: it ran as accepted
    final = ended(conn, child)
    assert final["state"] == "failed" and final["item_errors"] == 1, final
    assert final["error"] == f"1 of 2 items ended in an error, more than max_item_errors 0 allows; the most common (1): " \
                             f"{OVER}", final["error"]
    assert calls_per_item(model_server).get(long_review) == 1  # the parent's call; the child made none for it


def test_a_reduce_over_a_result_longer_than_its_price_assumed_fails_before_its_first_call(
        conn, burst, model_server, env):
    from jobs.intake import pipelines, submission
    from tests.test_items_workers import ended

    env.setenv("LEASH_MAX_ITEM_CHARS", str(SMALL))
    body = {"stages": [{"name": "answers", "kind": "prompt", "items": ["short", "a much longer item"],
                        "template": "{item}"},
                       {"name": "summary", "kind": "reduce", "instruction": "Summarise",
                        "items_from": {"stage": "answers", "results": True}}]}
    priced = pipelines.submit(conn, pipelines.read(body, "dana"), submission, dry_run=True).estimate
    summary = priced["stages"][1]
    print(summary["priced_at"], summary["estimate"]["calls"], summary["estimate"]["input_tokens"])
    assert f"each up to LEASH_MAX_ITEM_CHARS ({SMALL}) characters" in summary["priced_at"]  # the bound the run keeps
    submitted = pipelines.submit(conn, pipelines.read(body, "dana"), submission)
    first, reduce_job = (job_id for _, job_id in submitted.stages)
    burst()
    assert ended(conn, first)["state"] == "succeeded"
    final = ended(conn, reduce_job)
    print(final["error"])
    assert final["state"] == "failed" and final["error"].startswith(
        "1 of its 2 items is longer than the 20 characters an item may have (LEASH_MAX_ITEM_CHARS; items[1] is 24): "
        "reduce answers over every item, so it asked nothing"), final["error"]
    assert len(model_server.requests) == 2  # the first stage's two calls; none for the reduce
    assert final["usage"]["calls"] == 0
