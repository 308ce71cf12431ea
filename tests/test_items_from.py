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
