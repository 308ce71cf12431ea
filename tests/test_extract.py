"""The ``extract`` kind on a leash worker in the test's process against the loopback providers, through
the official SDKs: each answer follows a JSON Schema the provider is given natively (OpenAI's
strict ``json_schema``, Anthropic's forced tool); an answer that breaks it is asked again with the
validation error, the repair counted like any call, directly and after a provider batch; an item
never answered validly is an item error: every item, or more than ``max_item_errors`` (``max_invalid``),
fail the job, grouped by ``leash failures``; the CSV download has a column per property; a bad schema is refused at the door."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from cli import main
from jobs.deadletter import failures
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob
from jobs.models.structured import DEFAULT_TEMPLATE
from tests.fake_schema import schema_value
from tests.test_batch_jobs import FOLLOW, only_batch, waiting
from tests.test_items_workers import ended, stored

pytestmark = pytest.mark.slow

SCHEMA = {"title": "Review", "type": "object", "additionalProperties": False,
          "properties": {"product": {"type": "string"}, "stars": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["product", "stars", "tags"]}
ITEMS = [f"review {i} of gadget{i}" for i in range(20)]


def submit(conn, items=ITEMS, **payload) -> str:
    job_id, _ = enqueue(conn, "extract", {"items": list(items), "schema": SCHEMA, **payload})
    return job_id


def expected(item: str) -> dict:
    """What the stand-in answers when it follows the schema (tests.fake_openai.schema_value of
    the prompt it was sent: the default template around the item)."""
    return schema_value(SCHEMA, DEFAULT_TEMPLATE.replace("{item}", item))


def sent_schema(server, seen) -> dict | None:
    return server.structured_schema(seen.body)


def test_twenty_items_each_repaired_once_succeed_with_forty_calls_counted(conn, burst, provider_server):
    server = provider_server
    server.schema_answers = "break_first"
    job_id = submit(conn)
    burst()
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert stored(conn, job_id) == {i: expected(item) for i, item in enumerate(ITEMS)}
    assert final["result"]["summary"] == {"items": 20, "valid": 20, "invalid": 0}
    assert final["usage"]["calls"] == 40 and len(server.requests) == 40
    # Every call carried the schema natively; each repair carried the broken answer and why.
    assert all(sent_schema(server, seen) == SCHEMA for seen in server.requests)
    if server.BACKEND == "openai":
        assert all(seen.body["response_format"]["json_schema"]["strict"] is True for seen in server.requests)
    repairs = [seen for seen in server.requests if len(seen.body["messages"]) > 1]
    assert len(repairs) == 20
    for seen in repairs:
        assistant = seen.body["messages"][-2]
        assert assistant["role"] == "assistant" and '"product"' not in assistant["content"]
        assert "'product' is a required property" in seen.last


def test_the_csv_download_has_a_column_per_property_and_jsonl_holds_objects(conn, burst, model_server):
    model_server.schema_answers = "break_first"
    job_id = submit(conn, ITEMS[:3])
    burst()
    assert ended(conn, job_id)["state"] == "succeeded"

    out = CliRunner().invoke(main, ["results", job_id, "--format", "csv"])
    assert out.exit_code == 0, out.output
    rows = list(csv.reader(io.StringIO(out.stdout)))
    assert rows[0] == ["index", "item", "product", "stars", "tags", "error", "calls", "input_tokens", "output_tokens",
                       "cache_hits"]
    first = expected(ITEMS[0])
    assert rows[1][:6] == ["0", ITEMS[0], "gadget0", str(first["stars"]), '["gadget0"]', ""]
    assert rows[1][6] == "2"  # the first answer and its repair
    lines = CliRunner().invoke(main, ["results", job_id]).stdout.splitlines()
    assert [json.loads(line)["result"] for line in lines] == [expected(item) for item in ITEMS[:3]]


def test_in_batch_mode_first_answers_come_from_the_batch_and_repairs_go_direct(conn, burst, any_provider):
    server = any_provider
    server.schema_answers = "break_first"
    job_id = submit(conn, mode="batch")
    burst()
    waiting(conn, job_id)
    server.batches.complete(only_batch(server))
    burst(follow=FOLLOW)
    final = ended(conn, job_id)

    assert final["state"] == "succeeded", final["error"]
    assert stored(conn, job_id) == {i: expected(item) for i, item in enumerate(ITEMS)}
    assert len(server.batches.batch_billed) == 20 and len(server.requests) == 20  # 20 in the batch, 20 direct
    assert final["usage"]["calls"] == 40
    batch = server.batches.batch(only_batch(server))
    assert all(server.structured_schema(body) == SCHEMA for _, body in batch.requests)
    for seen in server.requests:  # each repair carries the batch's answer and the validation error
        assert seen.body["messages"][-2]["role"] == "assistant" and "'product' is a required property" in seen.last


def test_a_provider_that_never_follows_the_schema_fails_the_job_grouped_by_leash_failures(conn, burst, model_server):
    model_server.schema_answers = "never"
    first, second = submit(conn, ITEMS[:4]), submit(conn, ITEMS[4:6])
    burst()
    failed = [ended(conn, job_id) for job_id in (first, second)]

    for status, count in zip(failed, (4, 2), strict=True):
        assert status["state"] == "failed"
        assert status["error"].startswith(f"{count} of {count} items ended in an error; the most common ({count}): "
                                          "the answer does not follow the schema"), status["error"]
        assert "'product' is a required property" in status["error"] and status["item_errors"] == count
    assert len(model_server.requests) == 6 * 3  # each item: its answer and 2 repairs (LEASH_REPAIR_ATTEMPTS)
    assert failed[0]["usage"]["calls"] == 12
    assert stored(conn, first)[0]["error"].startswith("the answer does not follow the schema after 2 repairs")
    groups = failures.report(conn)["groups"]
    schema_groups = [g for g in groups if g["kind"] == "extract"]
    assert len(schema_groups) == 1 and schema_groups[0]["count"] == 2, groups
    out = CliRunner().invoke(main, ["failures"])
    assert "items ended in an error; the most common" in out.output and "extract" in out.output


@pytest.mark.parametrize("allowance", [{"max_invalid": 2}, {"max_item_errors": 2}, {"max_item_errors": "50%"}])
def test_max_item_errors_lets_a_job_succeed_with_those_items_keeping_their_error(conn, burst, model_server, env,
                                                                                  allowance):
    env.setenv("LEASH_REPAIR_ATTEMPTS", "1")
    model_server.schema_answers = "never:gadget1"  # items 1 and 10 of the four below never follow it
    job_id = submit(conn, [ITEMS[0], ITEMS[1], ITEMS[2], ITEMS[10]], **allowance)
    burst()
    final = ended(conn, job_id)
    assert final["state"] == "succeeded", final["error"]
    assert final["outcome"] == "succeeded_with_item_errors" and final["item_errors"] == 2
    assert final["result"]["summary"] == {"items": 4, "valid": 2, "invalid": 2}
    errors = [v["error"] for v in stored(conn, job_id).values() if "error" in v]
    assert len(errors) == 2 and all(e.startswith("the answer does not follow the schema after 1 repair:") for e in errors)


def test_one_item_error_more_than_max_item_errors_fails_the_job_naming_the_count(conn, burst, model_server, env):
    env.setenv("LEASH_REPAIR_ATTEMPTS", "0")
    model_server.schema_answers = "never:gadget1"
    job_id = submit(conn, [ITEMS[0], ITEMS[1], ITEMS[2], ITEMS[10]], max_item_errors=1)
    burst()
    final = ended(conn, job_id)
    assert final["state"] == "failed" and final["outcome"] == "failed" and final["item_errors"] == 2
    assert final["error"].startswith("2 of 4 items ended in an error, more than max_item_errors 1 allows; "
                                     "the most common (2): the answer does not follow the schema"), final["error"]


def test_a_bad_schema_is_refused_at_the_door_naming_the_problem(conn, model_server, tmp_path):
    loose = {**SCHEMA, "additionalProperties": True}
    partial = {**SCHEMA, "required": ["product"]}
    refused = {
        "not valid JSON Schema": ({**SCHEMA, "properties": {"a": {"type": "strin"}}}, "is not a valid JSON Schema"),
        "strict: additionalProperties": (loose, '"additionalProperties": false'),
        "strict: required": (partial, "missing 'stars', 'tags'"),
        "not an object": ({"type": "array"}, 'must describe an object'),
    }
    for schema, words in refused.values():
        with pytest.raises(InvalidJob, match=words):
            enqueue(conn, "extract", {"items": ["a"], "schema": schema})
    deep: dict = {"type": "string"}
    for _ in range(8):
        deep = {"type": "object", "properties": {"x": deep}, "required": ["x"], "additionalProperties": False}
    with pytest.raises(InvalidJob, match="LEASH_MAX_SCHEMA_DEPTH"):
        enqueue(conn, "extract", {"items": ["a"], "schema": deep})
    many = {"type": "object", "additionalProperties": False, "required": [f"p{i}" for i in range(101)],
            "properties": {f"p{i}": {"type": "string"} for i in range(101)}}
    with pytest.raises(InvalidJob, match="LEASH_MAX_SCHEMA_PROPERTIES"):
        enqueue(conn, "extract", {"items": ["a"], "schema": many})

    path = tmp_path / "schema.json"
    path.write_text(json.dumps(loose))
    out = CliRunner().invoke(main, ["submit", "--kind", "extract", "--schema", str(path), "-"], input="a review\n")
    assert out.exit_code == 2 and "additionalProperties" in out.output, out.output
    path.write_text(json.dumps(SCHEMA))
    out = CliRunner().invoke(main, ["submit", "--kind", "extract", "--schema", str(path), "-"], input="a review\n")
    assert out.exit_code == 0, out.output


def test_a_bad_schema_is_a_422_from_the_api(conn, client, model_server):
    answer = client.post("/jobs", json={"kind": "extract", "items": ["a"], "schema": {**SCHEMA, "required": []}})
    assert answer.status_code == 422
    assert "every property must be in \"required\"" in answer.get_json()["error"]
    answer = client.post("/jobs", json={"kind": "extract", "items": ["a"], "schema": SCHEMA})
    assert answer.status_code in (200, 201, 202), answer.get_json()
