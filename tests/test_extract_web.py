"""The ``extract`` kind on the web: the form takes a JSON Schema pasted or uploaded (and lists
its fields as it is typed: static/form.js), the job page's table has a column per property, and
the CSV download too; a bad schema is an inline error, never a 500."""

from __future__ import annotations

import csv
import io
import json
import re

from jobs.read.results import cells
from tests.web_support import HTML, csrf_from, finish_job

SCHEMA = {"type": "object", "properties": {"product": {"type": "string"}, "stars": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["product", "stars", "tags"], "additionalProperties": False}


def post_form(client, **fields):
    data = {"kind": "extract", "items": "a good pen\nbad ink", "csrf_token": csrf_from(client.get("/", headers=HTML).data),
            "submission": "form-0001", **fields}
    return client.post("/", data=data, headers=HTML, content_type="multipart/form-data")


def test_the_form_has_a_schema_box_an_upload_and_the_script_that_lists_its_fields(client, conn):
    page = client.get("/", headers=HTML).data.decode()
    assert 'name="schema"' in page and 'name="schema_file"' in page and 'name="max_item_errors"' in page
    assert 'data-fields="schema-fields"' in page and 'id="schema-fields"' in page
    assert "/static/form.js" in page
    script = client.get("/static/form.js").data.decode()
    assert "describeSchema" in script and "properties" in script


def test_a_schema_uploaded_through_the_form_makes_an_extract_job(client, conn):
    upload = (io.BytesIO(json.dumps(SCHEMA).encode()), "schema.json")
    response = post_form(client, schema="", schema_file=upload)
    assert response.status_code == 303, re.findall(r'role="alert">([^<]*)<', response.data.decode())
    job_id = re.fullmatch(r"/jobs/([\w-]+)", response.headers["Location"]).group(1)
    status = client.get(f"/jobs/{job_id}").get_json()
    assert status["kind"] == "extract"


def test_a_schema_that_is_not_json_schema_is_an_inline_error(client, conn):
    response = post_form(client, schema='{"type": "object", "properties": {"a": {"type": "strin"}}}')
    assert response.status_code == 422
    assert "is not a valid JSON Schema" in response.data.decode()
    response = post_form(client, schema="{not json")
    assert response.status_code == 422 and "is not JSON" in response.data.decode()


def test_the_job_page_and_the_csv_show_a_column_per_property(client, conn):
    answer = client.post("/jobs", json={"kind": "extract", "items": ["a good pen", "bad ink"], "schema": SCHEMA})
    assert answer.status_code == 202, answer.get_json()
    job_id = answer.get_json()["job_id"]
    finish_job(conn, job_id, [{"product": "pen", "stars": 5, "tags": ["good", "pen"]},
                              {"error": "the answer does not follow the schema after 2 repairs: 'stars' is required"}])
    html = client.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert re.search(r"<th class=\"property\">product</th><th class=\"property\">stars</th>"
                     r"<th class=\"property\">tags</th><th>Error</th>", html)
    assert '<td class="result">pen</td><td class="result">5</td><td class="result">[&#34;good&#34;, &#34;pen&#34;]</td>' in html
    assert "after 2 repairs" in html

    rows = list(csv.reader(io.StringIO(client.get(f"/jobs/{job_id}/result.csv").get_data(as_text=True))))
    assert rows[0][:6] == ["index", "item", "product", "stars", "tags", "error"]
    assert rows[1][:6] == ["0", "a good pen", "pen", "5", '["good", "pen"]', ""]
    assert rows[2][2:5] == ["", "", ""] and rows[2][5].startswith("the answer does not follow")
    lines = [json.loads(line) for line in client.get(f"/jobs/{job_id}/result.jsonl").get_data(as_text=True).splitlines()]
    assert lines[0]["result"] == {"product": "pen", "stars": 5, "tags": ["good", "pen"]}


def test_cells_show_nested_values_as_json_text_and_an_error_apart():
    assert cells({"a": {"b": [1]}, "c": "x"}, ["a", "c", "d"]) == ['{"b": [1]}', "x", None, None]
    assert cells({"error": "bad"}, ["a"]) == [None, "bad"]
    assert cells(None, ["a"]) == [None, None]
