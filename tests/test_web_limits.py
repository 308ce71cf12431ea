"""What one request may ask for is bounded: every limit is a 422 that names it and its setting,
checked before anything is written; CSV uploads, deep JSON and odd query numbers are 4xx,
never 5xx."""

from __future__ import annotations

import io
import json

import pytest

from tests.web_support import CLASSIFY, HTML, create_app_with, csrf_from

PROMPT = {"kind": "prompt", "items": ["a", "b"], "template": "Summarise: {item}"}


def post(client, body, headers=None):
    return client.post("/jobs", data=json.dumps(body), headers={"Content-Type": "application/json", **(headers or {})})


@pytest.mark.parametrize("body, message", [
    ({**CLASSIFY, "labels": [f"l{i}" for i in range(21)]}, "too many labels: 21 (at most 20, LEASH_MAX_LABELS)"),
    ({**CLASSIFY, "labels": ["ok", "x" * 41]}, "labels[1] is 41 characters long (at most 40, LEASH_MAX_LABEL_CHARS)"),
    ({**CLASSIFY, "labels": ["ok", "line\nbreak"]}, "labels[1] contains a control character"),
    ({**CLASSIFY, "labels": [chr(0x1F600 + i) * 40 for i in range(3)]}, "LEASH_MAX_SUMMARY_BYTES"),
    ({**CLASSIFY, "items": ["x"] * 1001}, "too many items: 1001 (at most 1000, LEASH_MAX_ITEMS)"),
    ({**CLASSIFY, "items": ["x" * 10_001]}, "items[0] is 10001 characters long (at most 10000, LEASH_MAX_ITEM_CHARS)"),
    ({**PROMPT, "template": "{item}" + "x" * 20_000}, "(at most 20000, LEASH_MAX_TEMPLATE_CHARS)"),
    ({**CLASSIFY, "junk": "x" * 900_000}, "unknown field 'junk'"),
    ({**CLASSIFY, "b": 1, "a": 2}, "unknown fields 'a', 'b'"),
    ({**PROMPT, "labels": ["x", "y"]}, "unknown field 'labels'"),
    ({**CLASSIFY, "items": json.loads("[" * 40 + "]" * 40)}, "nests 41 levels deep (at most 32, LEASH_MAX_PAYLOAD_DEPTH)"),
])
def test_each_limit_is_a_422_naming_it_and_nothing_is_written(client, conn, body, message):
    response = post(client, body)
    assert response.status_code == 422, response.get_json()
    assert message in response.get_json()["error"]
    assert conn.dbsize() == 0


def test_limits_are_settings(env, conn):
    env.setenv("LEASH_MAX_ITEMS", "3")
    env.setenv("LEASH_MAX_LABELS", "2")
    env.setenv("LEASH_MAX_PAYLOAD_BYTES", "2000")
    env.setenv("LEASH_MAX_PAYLOAD_DEPTH", "3")
    client = create_app_with().test_client()
    assert "(at most 3, LEASH_MAX_ITEMS)" in post(client, {**CLASSIFY, "items": list("abcd")}).get_json()["error"]
    assert "(at most 2, LEASH_MAX_LABELS)" in post(client, {**CLASSIFY, "labels": list("abc")}).get_json()["error"]
    too_big = post(client, {**CLASSIFY, "items": ["x" * 1500, "y" * 600]})
    assert too_big.status_code == 422 and "(at most 2000, LEASH_MAX_PAYLOAD_BYTES)" in too_big.get_json()["error"]
    # depth 3: the payload object, the items list, a list inside it
    assert post(client, {"kind": "count", "items": ["a"], "extra": [["b"]]}).status_code == 202
    nested = post(client, {"kind": "count", "items": ["a"], "extra": [[["b"]]]})
    assert nested.status_code == 422 and "(at most 3, LEASH_MAX_PAYLOAD_DEPTH)" in nested.get_json()["error"]
    assert post(client, {**CLASSIFY, "items": list("abc")}).status_code == 202


def test_json_nested_around_the_parsers_limit_is_a_4xx_at_every_depth(client, conn):
    statuses = set()
    for depth in [*range(2, 40, 6), *range(900, 1100, 3), 5000]:
        body = '{"kind": "classify", "labels": ["a", "b"], "items": ' + "[" * depth + '"x"' + "]" * depth + "}"
        response = client.post("/jobs", data=body, headers={"Content-Type": "application/json"})
        assert response.status_code in (400, 422), (depth, response.status_code)
        statuses.add(response.status_code)
    assert statuses == {400, 422}  # both sides of the parser's limit were reached
    assert conn.dbsize() == 0


@pytest.mark.parametrize("value", ["٣", "5_000", "+5", " 5", "5 ", "-0", "1e3", "0x10", "５", "9" * 5000])
def test_query_numbers_are_ascii_digits_only(client, conn, value):
    for url in (f"/jobs?offset={value}", f"/jobs?limit={value}", f"/jobs/some-id/result?offset={value}"):
        response = client.get(url, query_string=None)
        assert response.status_code == 400, (url, response.status_code)
        assert "must be an integer" in response.get_json()["error"]
    assert client.get("/jobs?offset=5&limit=7").status_code == 200


@pytest.fixture
def browser(app):
    browser = app.test_client()
    browser.token = csrf_from(browser.get("/", headers=HTML).data)
    return browser


def upload(browser, content: bytes, filename: str = "items.csv"):
    data = {"kind": "classify", "labels": "positive, negative", "items": "", "csrf_token": browser.token,
            "submission": "form-0001", "items_file": (io.BytesIO(content), filename)}
    return browser.post("/", data=data, headers=HTML, content_type="multipart/form-data")


@pytest.mark.parametrize("content, message", [
    (b"text\n" + b"x" * 200_000 + b"\n", b"a cell is longer than 131072 characters"),
    (b"text\n" + b"y" * 20_000 + b"\n", b"Item 1 is 20000 characters long (at most 10000, LEASH_MAX_ITEM_CHARS)"),
    (b'text\n"an unterminated quote\nswallowing\nthe rest\n', b"line 4: the file is not valid CSV"),
    (b'text\n"quoted" then text\n', b"not valid CSV"),
    (b"text\n\xff\xfe caf\xe9\n", b"the file is not UTF-8"),
    (b"text\n" + b"a\n" * 1001, b"Too many items: 1001"),
])
def test_csv_problems_are_a_422_on_the_upload_field(browser, conn, content, message):
    response = upload(browser, content)
    assert response.status_code == 422
    assert message in response.data.replace(b"&#34;", b'"').replace(b"&#39;", b"'")
    assert b'id="items_file-error"' in response.data  # shown next to the upload field
    assert conn.dbsize() == 0


def test_a_csv_with_nul_bytes_and_quoted_newlines_is_read(browser, conn):
    response = upload(browser, b'text\n"two\nlines"\nnul\x00inside\n')
    assert response.status_code == 303


def test_a_missing_field_is_a_400_even_beside_an_unknown_one(client, conn):
    response = post(client, {"kind": "classify", "labels": ["a", "b"], "odd name": 1})
    assert response.status_code == 400 and "missing field 'items'" in response.get_json()["error"]
