"""The pages people use: the form (CSRF, inline errors, uploads), the job page (progress,
attempts, stale badge, error, results table, cancel, refresh without JavaScript), the list."""

from __future__ import annotations

import io
import re
import time

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.core import states
from tests.web_support import HTML, csrf_from, finish_job


@pytest.fixture
def browser(app):
    browser = app.test_client()
    browser.token = csrf_from(browser.get("/", headers=HTML).data)
    return browser


def post_form(browser, **fields):
    data = {"kind": "classify", "labels": "positive, negative", "items": "", "csrf_token": browser.token,
            "submission": "form-0001", **fields}
    return browser.post("/", data=data, headers=HTML, content_type="multipart/form-data")


def payload_of(conn, job_id):
    return Job.fetch(job_id, connection=conn, serializer=JSONSerializer).args[1]


def test_the_form_page_has_the_fields_and_a_csrf_token(client, conn):
    page = client.get("/", headers=HTML)
    assert page.status_code == 200
    for name in (b'name="kind"', b'name="labels"', b'name="items"', b'name="items_file"', b'name="csrf_token"'):
        assert name in page.data
    assert b'<option selected value="classify"' in page.data  # the first kind, chosen


def test_a_valid_submission_is_a_303_to_the_job_page(browser, conn):
    response = post_form(browser, items="good film\n\nbad film\n")
    assert response.status_code == 303
    job_id = re.fullmatch(r"/jobs/([\w-]+)", response.headers["Location"]).group(1)
    assert payload_of(conn, job_id) == {"items": ["good film", "bad film"], "labels": ["positive", "negative"]}
    # Open mode (the default): the form's jobs belong to the one shared owner, like the CLI's and curl's.
    assert conn.hget(keys.job(job_id), "owner").decode() == "shared"


def test_submitting_the_same_form_twice_makes_one_job(browser, conn):
    first = post_form(browser, items="a\nb", submission="form-same-1")
    second = post_form(browser, items="a\nb", submission="form-same-1")
    assert first.headers["Location"] == second.headers["Location"]
    assert len(conn.keys(keys.job("*"))) == 1


def test_a_form_without_its_csrf_token_is_refused_and_creates_nothing(client, conn):
    response = client.post("/", data={"kind": "classify", "labels": "a", "items": "x", "submission": "form-0001"},
                           headers=HTML)
    assert response.status_code in (403, 422)
    assert b"Reload the page" in response.data or b"reload the page" in response.data.lower()
    assert not conn.keys(keys.job("*"))


@pytest.mark.parametrize("fields, field_id, message", [
    ({"items": ""}, "items", b"Give at least one item: one per line, or upload a file"),
    ({"items": "x", "labels": ""}, "labels", b"Give the labels to choose from, separated by commas"),
    ({"items": "x", "labels": "a, a"}, "labels", b"A label is given twice; give each label once"),
    ({"items": "x" * 10_001}, "items", b"Item 1 is 10001 characters long"),
    ({"items": "x", "kind": "prompt", "template": "no placeholder"}, "template",
     b"The template must contain {item}, where each item goes"),
    ({"items": "x", "kind": "nonsense"}, "kind", b"Not a valid choice"),
])
def test_invalid_input_is_shown_inline_next_to_its_field(browser, conn, fields, field_id, message):
    response = post_form(browser, **fields)
    assert response.status_code == 422
    error = re.search(rb'<p class="field-error" id="' + field_id.encode() + rb'-error" role="alert">(.*?)</p>',
                      response.data, re.S)
    assert error and message in error.group(1), response.data.decode()[:3000]
    assert re.search(rb'id="' + field_id.encode() + rb'"[^>]*aria-invalid="true"', response.data) or \
        re.search(rb'aria-invalid="true"[^>]*id="' + field_id.encode() + rb'"', response.data)
    assert not conn.keys(keys.job("*"))


@pytest.mark.parametrize("filename, content, items", [
    ("items.txt", b"first\r\nsecond\n\nthird\n", ["first", "second", "third"]),
    ("items.csv", b"id,text\n1,\"hello, world\"\n2,bye\n", ["hello, world", "bye"]),
    ("plain.csv", b"alpha,1\nbeta,2\n", ["alpha", "beta"]),
    ("bom.txt", "\ufeffüber\nnaïve\n".encode(), ["über", "naïve"]),
])
def test_items_can_be_uploaded_as_txt_or_csv(browser, conn, filename, content, items):
    response = post_form(browser, items="ignored when a file is given",
                         items_file=(io.BytesIO(content), filename))
    assert response.status_code == 303, response.data.decode()[:2000]
    assert payload_of(conn, response.headers["Location"].rsplit("/", 1)[1])["items"] == items


def test_an_upload_of_the_wrong_type_or_encoding_is_an_inline_error(browser, conn):
    wrong_type = post_form(browser, items_file=(io.BytesIO(b"x"), "items.xlsx"))
    assert wrong_type.status_code == 422 and b"upload a .txt" in wrong_type.data
    not_utf8 = post_form(browser, items_file=(io.BytesIO(b"\xff\xfe\xfa"), "items.txt"))
    assert not_utf8.status_code == 422 and b"not UTF-8 text" in not_utf8.data
    assert not conn.keys(keys.job("*"))


def _job(browser, conn, items="a\nb\nc\nd"):
    response = post_form(browser, items=items, submission=f"form-{time.monotonic_ns()}")
    return response.headers["Location"].rsplit("/", 1)[1]


def test_a_running_job_page_shows_progress_attempts_cancel_and_refreshes_without_js(browser, conn):
    job_id = _job(browser, conn)
    conn.hset(keys.job(job_id), mapping={"state": "running", "done": 1, "attempts": 1,
                                        "lease_expires_at": time.time() + 60})
    page = browser.get(f"/jobs/{job_id}", headers=HTML)
    assert page.status_code == 200 and page.mimetype == "text/html"
    html = page.data.decode()
    assert re.search(r'<progress id="progress" max="4" value="1"', html)
    assert "1 of 4 items (25%)" in html and ">1 of 3<" in html
    assert 'id="stale"' not in html
    assert f'action="/jobs/{job_id}/cancel"' in html and "Cancel job" in html
    assert re.search(r'<noscript><meta http-equiv="refresh" content="1"></noscript>', html)
    # Results while it runs: every item of the page, the ones not done yet marked pending.
    assert "job.js" in html and "Results so far" in html and html.count('<span class="pending">pending</span>') == 4


def test_a_stale_job_page_shows_the_stale_badge(browser, conn):
    job_id = _job(browser, conn)
    conn.hset(keys.job(job_id), mapping={"state": "running", "done": 2, "attempts": 1,
                                        "lease_expires_at": time.time() - 5})
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    badge = re.search(r'<span id="stale" class="badge stale" ?>(.*?)</span>', html)
    assert badge and badge.group(1) == "stale — the worker stopped reporting, the job will be retried"


def test_a_failed_job_page_shows_its_error_and_no_refresh(browser, conn):
    job_id = _job(browser, conn)
    conn.hset(keys.job(job_id), mapping={"state": "failed", "attempts": 3,
                                        "error": "RuntimeError: the model returned <garbage>"})
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert "RuntimeError: the model returned &lt;garbage&gt;" in html  # escaped
    assert 'http-equiv="refresh"' not in html and "Cancel job" not in html and "job.js" not in html


def test_a_finished_job_page_shows_the_results_table_paged(browser, conn):
    items = "\n".join(f"text number {i}" for i in range(60))
    job_id = _job(browser, conn, items=items)
    finish_job(conn, job_id, [f"label-{i}" for i in range(60)], summary={"items": 60})
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    rows = re.findall(r'<tr><td>(\d+)</td><td class="item">(.*?)</td><td class="result">(.*?)</td></tr>', html)
    assert len(rows) == 50 and rows[0] == ("1", "text number 0", "label-0")
    assert re.search(r'<progress id="progress" max="60" value="60"', html)
    assert f'href="/jobs/{job_id}?offset=50" rel="next"' in html
    second = browser.get(f"/jobs/{job_id}?offset=50", headers=HTML).data.decode()
    rows = re.findall(r'<tr><td>(\d+)</td><td class="item">(.*?)</td><td class="result">(.*?)</td></tr>', second)
    assert [r[0] for r in rows] == [str(i) for i in range(51, 61)]
    assert 'http-equiv="refresh"' not in html


def test_the_cancel_button_cancels_and_returns_to_the_page(browser, conn):
    job_id = _job(browser, conn)
    # The button asks first (a page, no JavaScript needed); nothing is canceled until confirmed.
    asked = browser.post(f"/jobs/{job_id}/cancel", data={"csrf_token": browser.token}, headers=HTML)
    page = asked.data.decode()
    assert asked.status_code == 200 and 'id="confirm-form"' in page and 'name="confirm" value="yes"' in page
    assert f'action="/jobs/{job_id}/cancel"' in page and f'href="/jobs/{job_id}"' in page
    assert states.status(conn, job_id)["state"] == "queued"
    response = browser.post(f"/jobs/{job_id}/cancel", data={"csrf_token": browser.token, "confirm": "yes"},
                            headers=HTML)
    assert response.status_code == 303 and response.headers["Location"] == f"/jobs/{job_id}"
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert 'class="state state-canceled">canceled<' in html and 'id="canceled-note"' in html
    assert "Cancel job" not in html


def test_the_jobs_page_lists_my_jobs_newest_first(browser, conn):
    first, second = _job(browser, conn), _job(browser, conn)
    html = browser.get("/jobs", headers=HTML).data.decode()
    assert html.index(f"/jobs/{second}") < html.index(f"/jobs/{first}")
    assert html.count("<progress") == 2


def test_a_browser_gets_html_error_replies(client, conn):
    missing = client.get("/jobs/unknown-id", headers=HTML)
    assert missing.status_code == 404 and missing.mimetype == "text/html" and b"no such job" in missing.data


def test_a_retried_job_shows_the_earlier_attempts_error_as_a_note_not_as_an_error(browser, conn):
    job_id = _job(browser, conn)
    conn.hset(keys.job(job_id), mapping={"state": "running", "attempts": 2,
                                          "error": "lease expired 0.2s ago on worker w1"})
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert 'id="error-box" class="error-box retrying"' in html
    assert "Why the last attempt did not finish" in html and "Why it failed" not in html
    assert '<p id="error" class="error-summary">lease expired 0.2s ago on worker w1</p>' in html


def test_a_succeeded_job_has_no_error_even_after_a_failed_attempt(browser, conn):
    job_id = _job(browser, conn)
    finish_job(conn, job_id, ["positive"] * 4)
    conn.hset(keys.job(job_id), mapping={"attempts": 2, "error": "lease expired 0.2s ago on worker w1"})
    assert browser.get(f"/jobs/{job_id}").get_json()["error"] is None
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert 'id="error-box"' not in html


def test_pages_forbid_framing_and_foreign_scripts(client, conn):
    page = client.get("/", headers=HTML)
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]


def test_the_form_takes_a_name_and_says_when_it_is_too_long(browser, conn):
    response = post_form(browser, items="good\nbad", name="  Support inbox  ")
    assert response.status_code == 303
    job_id = response.headers["Location"].rsplit("/", 1)[1]
    assert conn.hget(keys.job(job_id), "name") == b"Support inbox"
    refused = post_form(browser, items="good", name="n" * 101, submission="form-0002")
    assert refused.status_code == 422 and "The name is 101 characters long; at most 100" in refused.data.decode()


def test_canceling_a_running_job_says_at_once_that_the_cancel_is_on_its_way(browser, conn):
    from jobs.core import lease

    job_id = _job(browser, conn)
    lease.claim(conn, job_id, "leash", "w")
    response = browser.post(f"/jobs/{job_id}/cancel", data={"csrf_token": browser.token, "confirm": "yes"},
                            headers=HTML)
    assert response.status_code == 303 and response.headers["Location"] == f"/jobs/{job_id}?cancel=requested"
    html = browser.get(response.headers["Location"], headers=HTML).data.decode()
    assert 'id="cancel-requested"' in html and "stops at its next heartbeat" in html
    assert 'id="cancel-button"' not in html and 'class="state state-running">running<' in html
    # Times are UTC with the distance beside them.
    assert re.search(r'UTC</time> <span class="ago">\((just now|\d+ s ago)\)</span>', html)
