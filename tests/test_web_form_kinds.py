"""The form shows the chosen kind's fields only (``?kind=`` without JavaScript), the Estimate as a
block beside the buttons, schema errors in words; an extract job's page shows its schema."""

from __future__ import annotations

import json
import re

import pytest

from jobs import kinds
from tests.web_support import HTML, csrf_from

SCHEMA = {"type": "object", "properties": {"product": {"type": "string"}, "stars": {"type": "integer"}},
          "required": ["product", "stars"], "additionalProperties": False}


@pytest.fixture
def browser(app):
    browser = app.test_client()
    browser.token = csrf_from(browser.get("/", headers=HTML).data)
    return browser


def shown_fields(html: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r'<div class="field kind-field" id="(\w+)-field" data-kinds="[^"]*">', html)}


def hidden_fields(html: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r'<div class="field kind-field" id="(\w+)-field" data-kinds="[^"]*" hidden>',
                                            html)}


def declared(kind: str) -> set[str]:
    return {f.name for f in kinds.KINDS[kind].fields}


def test_the_form_shows_the_first_kinds_fields_and_each_kind_its_own(client, conn):
    first = client.get("/", headers=HTML).data.decode()
    assert shown_fields(first) == declared("classify") and "labels" in declared("classify")
    assert {"template", "schema"} <= hidden_fields(first)
    extract = client.get("/?kind=extract", headers=HTML).data.decode()
    assert shown_fields(extract) == declared("extract") and {"schema", "template"} <= declared("extract")
    assert "labels" in hidden_fields(extract)
    assert '<option selected value="extract">' in extract
    prompt = client.get("/?kind=prompt", headers=HTML).data.decode()
    assert shown_fields(prompt) == declared("prompt") and "schema" in hidden_fields(prompt)
    # Without JavaScript, links choose the kind.
    links = re.search(r'<noscript><p class="hint kind-links".*?</noscript>', extract, re.S).group(0)
    assert 'href="/?kind=prompt"' in links and 'href="/?kind=extract" aria-current="true"' in links
    assert shown_fields(client.get("/?kind=nonsense", headers=HTML).data.decode()) == declared("classify")


def submit(browser, **fields):
    data = {"csrf_token": browser.token, "submission": "form-kinds-0001", "items": "a\nb"} | fields
    return browser.post("/", data=data, headers=HTML)


def test_a_refused_submission_keeps_showing_the_kind_it_was_for(browser, conn):
    html = submit(browser, kind="extract", schema="").data.decode()
    assert shown_fields(html) == declared("extract")
    assert 'id="schema-error"' in html and "The schema is empty" in html
    assert "Expecting value" not in html


@pytest.mark.parametrize("text,says", [
    ("", "The schema is empty"),
    ('{"type": "object" "properties": {}}', "a comma is missing at line 1, column 19"),
    ("{'type': 'object'}", "a property name needs double quotes"),
])
def test_schema_errors_say_what_is_wrong_in_words_and_where(browser, conn, text, says):
    response = submit(browser, kind="extract", schema=text)
    assert response.status_code == 422 and says in response.data.decode()


def test_the_api_says_an_empty_schema_is_empty(client, conn):
    response = client.post("/jobs", json={"kind": "extract", "items": ["a"], "schema": ""})
    assert response.status_code == 422 and response.get_json()["error"].startswith("'schema' is empty")


def test_the_estimate_is_a_block_of_lines_beside_the_buttons(browser, conn):
    html = submit(browser, kind="classify", labels="yes,no", estimate="1").data.decode()
    actions = html[html.index('<div class="actions">'):html.index("</form>")]
    assert actions.index('id="estimate-button"') < actions.index('<section class="estimate" id="estimate"')
    lines = re.findall(r"<li>(.*?)</li>", actions)
    assert len(lines) >= 2 and any("calls" in line for line in lines), lines


def test_an_extract_jobs_page_shows_its_schema(client, conn):
    job_id = client.post("/jobs", json={"kind": "extract", "items": ["a"], "schema": SCHEMA}).get_json()["job_id"]
    classify = client.post("/jobs", json={"kind": "classify", "items": ["a"], "labels": ["x", "y"]}).get_json()
    html = client.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    shown = re.search(r'<dd id="schema">(.*?)</dd>', html, re.S).group(1)
    assert "<summary>2 fields: product, stars</summary>" in shown
    text = re.search(r"<pre class=\"template\">(.*?)</pre>", shown, re.S).group(1).replace("&#34;", '"')
    assert json.loads(text) == SCHEMA
    assert 'id="schema"' not in client.get(f"/jobs/{classify['job_id']}", headers=HTML).data.decode()
