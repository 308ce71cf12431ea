"""What a person sees of a job: the status fields beside the state (timing, speed, why it
waits, attempt history), the job page in each state, downloads of every result, the jobs
list by state, and the form's template field, CSV headers and all errors at once."""

from __future__ import annotations

import ast
import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rq.job import Job
from rq.registry import ScheduledJobRegistry
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.core import control, lease
from tests.conftest import ROOT
from tests.web_support import HTML, TOKENS, bearer, csrf_from

TRACEBACK = ("RuntimeError: the model returned <garbage>\nTraceback (most recent call last):\n"
             '  File "/srv/app/jobs/kinds.py", line 12, in classify\n    raise RuntimeError(...)\n')


@pytest.fixture
def browser(app):
    browser = app.test_client()
    browser.token = csrf_from(browser.get("/", headers=HTML).data)
    return browser


def submit(client, items=("good film", "bad film", "fine"), **extra):
    body = {"kind": "classify", "items": list(items), "labels": ["positive", "negative"], **extra}
    response = client.post("/jobs", json=body)
    assert response.status_code == 202, response.get_json()
    return response.get_json()["job_id"]


def test_a_retried_job_tells_its_attempts_story_and_its_next_retry(client, conn, env):
    job_id = submit(client, max_attempts=3)
    first = lease.claim(conn, job_id, "leash", "worker-a")
    first.heartbeat(item=(0, '"positive"'))
    first.fail(TRACEBACK, permanent=False)
    second = lease.claim(conn, job_id, "leash", "worker-b")
    second.release()  # a deploy: handed off, not counted
    third = lease.claim(conn, job_id, "leash", "worker-c")
    third.heartbeat(item=(1, '"negative"'))
    status = client.get(f"/jobs/{job_id}").get_json()
    assert status["state"] == "running" and status["error_summary"] == "RuntimeError: the model returned <garbage>"
    story = [(a["attempt"], a["worker"], a["ended"]) for a in status["history"]]
    assert story == [(1, "worker-a", "RuntimeError: the model returned <garbage>"),
                     (2, "worker-b", "handed off"), (2, "worker-c", "running")]
    assert status["started_at"] == status["history"][0]["started_at"]
    assert status["items_per_second"] > 0 and status["eta_seconds"] is not None
    assert status["labels"] == ["positive", "negative"] and status["template"] is None

    third.fail("TimeoutError: no answer", permanent=False)
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    at = datetime.now(UTC) + timedelta(minutes=5)
    ScheduledJobRegistry(job.origin, connection=conn).schedule(job, at)
    job.set_status("scheduled")
    waiting = client.get(f"/jobs/{job_id}").get_json()
    assert waiting["state"] == "queued" and waiting["waiting"].startswith("waiting to retry at ")
    assert waiting["next_retry_at"][:16] == at.strftime("%Y-%m-%dT%H:%M")
    html = client.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert 'id="next-retry"' in html and "worker-b" in html and "handed off" in html


def test_a_job_held_by_its_owners_limit_says_so(client, conn, env):
    env.setenv("LEASH_OWNER_CONCURRENCY", "1")
    submit(client)
    held = submit(client)
    status = client.get(f"/jobs/{held}").get_json()
    assert status["state"] == "queued"
    assert status["waiting"].startswith("owner limit reached: 1 of 1 jobs queued or running")


def test_a_failed_job_page_shows_the_first_line_and_folds_the_traceback(browser, client, conn, env):
    job_id = submit(client, max_attempts=1)
    lease.claim(conn, job_id, "leash", "w").fail(TRACEBACK, permanent=True)
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert '<p id="error" class="error-summary">RuntimeError: the model returned &lt;garbage&gt;</p>' in html
    folded = re.search(r'<details id="traceback"><summary>.*?</summary><pre>(.*?)</pre></details>', html, re.S)
    assert folded and folded.group(1).startswith("Traceback (most recent call last):\n  File")  # breaks kept
    assert "Why it failed" in html and "state-failed" in html


def test_a_canceled_job_is_shown_canceled_with_the_results_it_had(browser, client, conn, env):
    job_id = submit(client)
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.heartbeat(item=(0, '"positive"'))
    control.cancel(conn, job_id)
    attempt.fail("canceled", permanent=True)  # what the runner does at the next heartbeat
    status = client.get(f"/jobs/{job_id}").get_json()
    assert (status["state"], status["canceled"]) == ("failed", True)
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert 'class="state state-canceled">canceled<' in html and "after 1 of 3 items" in html
    assert 'id="error-box"' not in html
    assert "Items 1–3 of 3" in html and html.count('<span class="pending">no result</span>') == 2


def test_downloads_stream_every_item_beside_its_result_as_csv_and_jsonl(client, conn, env):
    items = [f"review {n}, \"quoted\"" for n in range(700)]  # two pages
    job_id = submit(client, items=items)
    attempt = lease.claim(conn, job_id, "leash", "w")
    for n in range(700):
        attempt.heartbeat(item=(n, json.dumps("positive" if n % 2 else {"error": "no answer"})))
    attempt.finish({"items": 700})
    response = client.get(f"/jobs/{job_id}/result.csv")
    assert response.status_code == 200 and response.mimetype == "text/csv" and response.is_streamed
    assert "attachment" in response.headers["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.get_data(as_text=True))))
    assert rows[0] == ["index", "item", "result", "calls", "input_tokens", "output_tokens", "cache_hits"]
    assert len(rows) == 701 and rows[700][2] == "positive"
    assert rows[1] == ["0", 'review 0, "quoted"', '{"error": "no answer"}', "", "", "", ""]
    lines = client.get(f"/jobs/{job_id}/result.jsonl").get_data(as_text=True).splitlines()
    assert len(lines) == 700 and json.loads(lines[699]) == {"index": 699, "item": 'review 699, "quoted"',
                                                            "result": "positive", "usage": None}
    html = client.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert f'href="/jobs/{job_id}/result.csv"' in html and f'href="/jobs/{job_id}/result.jsonl"' in html


def test_a_csv_download_shows_formulas_as_text_and_the_jsonl_keeps_them(client, conn):
    items = ["=HYPERLINK(\"http://x.example\",\"click\")", "+1+2", "@SUM(A1)", "-3.5", "plain", "\tx"]
    job_id = submit(client, items=items)
    attempt = lease.claim(conn, job_id, "leash", "w")
    for n in range(len(items)):
        attempt.heartbeat(item=(n, json.dumps("-cmd|' /C calc'!A0" if n == 0 else -2 if n == 3 else "ok")))
    attempt.finish({"items": len(items)})
    rows = list(csv.reader(io.StringIO(client.get(f"/jobs/{job_id}/result.csv").get_data(as_text=True))))[1:]
    assert [row[1] for row in rows] == ["'" + items[0], "'+1+2", "'@SUM(A1)", "-3.5", "plain", "'\tx"]
    assert rows[0][2] == "'-cmd|' /C calc'!A0" and rows[3][2] == "-2" and rows[1][2] == "ok"
    lines = [json.loads(line) for line in client.get(f"/jobs/{job_id}/result.jsonl").get_data(as_text=True).splitlines()]
    assert [line["item"] for line in lines] == items and lines[0]["result"] == "-cmd|' /C calc'!A0"


def test_downloads_are_the_owners_only(token_app, conn):
    client = token_app.test_client()
    job_id = client.post("/jobs", json={"kind": "classify", "items": ["x"], "labels": ["a", "b"]},
                         headers=bearer("alice")).get_json()["job_id"]
    assert client.get(f"/jobs/{job_id}/result.csv", headers=bearer("bob")).status_code == 404
    assert client.get(f"/jobs/{job_id}/result.jsonl", headers=bearer("alice")).status_code == 200
    assert set(TOKENS) == {"alice", "bob"}


def test_the_jobs_list_filters_by_state(browser, client, conn, env):
    done, canceled, waiting = submit(client), submit(client), submit(client)
    lease.claim(conn, done, "leash", "w").finish({"items": 3})
    control.cancel(conn, canceled)
    assert [j["job_id"] for j in client.get("/jobs?state=queued").get_json()["jobs"]] == [waiting]
    view = client.get("/jobs?state=canceled").get_json()
    assert [j["job_id"] for j in view["jobs"]] == [canceled] and view["total"] == 1
    assert view["jobs"][0]["state"] == "failed" and view["jobs"][0]["canceled"] is True
    assert client.get("/jobs?state=failed").get_json()["total"] == 0, "a canceled job is not a failure"
    assert client.get("/jobs?state=lost").status_code == 400
    html = browser.get("/jobs?state=succeeded", headers=HTML).data.decode()
    assert f"/jobs/{done}" in html and f"/jobs/{waiting}" not in html and 'aria-current="page">succeeded' in html
    everything = browser.get("/jobs", headers=HTML).data.decode()
    for view, count in (("all", 3), ("queued", 1), ("succeeded", 1), ("failed", 0), ("canceled", 1)):
        assert re.search(rf'>{view} <span class="count">{count}</span>', everything), view
    assert 'data-active="1"' in everything and "jobs.js" in everything  # it refreshes itself while jobs run


def post_form(browser, **fields):
    data = {"kind": "classify", "labels": "", "template": "", "items": "", "csrf_token": browser.token,
            "submission": "form-page-1", **fields}
    return browser.post("/", data=data, headers=HTML, content_type="multipart/form-data")


def test_the_form_shows_every_fields_error_at_once(browser, conn):
    response = post_form(browser)
    assert response.status_code == 422
    html = response.data.decode()
    assert 'id="items-error"' in html and 'id="labels-error"' in html
    assert "Please fix the 2 fields marked below." in html
    assert not conn.keys(keys.job("*"))


def test_the_form_submits_a_prompt_job_with_its_template(browser, conn):
    response = post_form(browser, kind="prompt", template="One line about: {item}", items="a\nb",
                         labels="ignored for prompt")
    assert response.status_code == 303
    job_id = response.headers["Location"].rsplit("/", 1)[1]
    payload = Job.fetch(job_id, connection=conn, serializer=JSONSerializer).args[1]
    assert payload == {"items": ["a", "b"], "template": "One line about: {item}"}
    missing = post_form(browser, kind="prompt", items="a", submission="form-page-2")
    assert missing.status_code == 422 and 'id="template-error"' in missing.data.decode()


@pytest.mark.parametrize("content, items", [
    (b"id,review\n1,great film\n2,awful film\n", ["great film", "awful film"]),
    (b"id;review;score\n1;great film, really;5\n2;bad;1\n", ["great film, really", "bad"]),
    (b"review\nI loved it\nawful\n", ["I loved it", "awful"]),
])
def test_a_csv_header_is_detected_and_the_text_column_chosen(browser, conn, content, items):
    response = post_form(browser, labels="a, b", items_file=(io.BytesIO(content), "reviews.csv"))
    assert response.status_code == 303, response.data.decode()[:2000]
    job_id = response.headers["Location"].rsplit("/", 1)[1]
    assert Job.fetch(job_id, connection=conn, serializer=JSONSerializer).args[1]["items"] == items


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.update(f"{'.' * node.level}{node.module or ''}.{alias.name}".replace("..", ".")
                         for alias in node.names)
            found.add(f"{'.' * node.level}{node.module or ''}")
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_api_and_the_pages_do_not_import_each_other():
    api, pages = _imports(ROOT / "web" / "api.py"), _imports(ROOT / "web" / "pages.py")
    assert not {name for name in api if "pages" in name}, api
    assert not {name for name in pages if name.split(".")[-1] == "api" or name.endswith(".api")}, pages


def test_a_cancel_in_rqs_own_tools_is_shown_and_counted_as_a_cancel(client, conn, env):
    from jobs.core.upkeep import consistency
    from jobs.deadletter import alerts, failures

    job_id = submit(client)
    assert consistency.end_outside(conn, job_id, consistency.ENDED_BY_RQ["canceled"])
    status = client.get(f"/jobs/{job_id}").get_json()
    assert (status["state"], status["canceled"]) == ("failed", True)
    assert alerts.check(conn, 3600).failed == 0 and alerts.check(conn, 3600, include_canceled=True).failed == 1
    assert failures.report(conn)["total"] == 0 and failures.report(conn, include_canceled=True)["total"] == 1


def test_jobs_have_a_name_and_the_list_searches_and_filters_by_kind_and_date(browser, client, conn, env):
    named = submit(client, name="March reviews")
    prompt = client.post("/jobs", json={"kind": "prompt", "items": ["x"], "template": "Say {item}"}).get_json()["job_id"]
    failing = submit(client)
    lease.claim(conn, failing, "leash", "w").fail("RuntimeError: the model server answered 500 " + "word " * 30,
                                                  permanent=True)
    assert client.get(f"/jobs/{named}").get_json()["name"] == "March reviews"
    search = client.get("/jobs?q=MARCH").get_json()
    assert [j["job_id"] for j in search["jobs"]] == [named]
    assert [j["job_id"] for j in client.get(f"/jobs?q={prompt[:8]}").get_json()["jobs"]] == [prompt]
    assert [j["job_id"] for j in client.get("/jobs?kind=prompt").get_json()["jobs"]] == [prompt]
    today = datetime.now(UTC).date()
    assert client.get(f"/jobs?from={today}&to={today}").get_json()["total"] == 3
    assert client.get(f"/jobs?from={today + timedelta(days=1)}").get_json()["total"] == 0
    for bad in ("kind=nope", "from=yesterday", f"from={today}&to={today - timedelta(days=1)}", "q=" + "x" * 101):
        response = client.get(f"/jobs?{bad}")
        assert response.status_code == 400 and "error" in response.get_json(), bad
    too_long = client.post("/jobs", json={"kind": "classify", "items": ["x"], "labels": ["a", "b"], "name": "n" * 101})
    assert too_long.status_code == 422 and "'name'" in too_long.get_json()["error"]
    html = browser.get("/jobs?q=march", headers=HTML).data.decode()
    assert '<span class="job-name">March reviews</span>' in html and f"/jobs/{prompt}" not in html
    page = browser.get("/jobs", headers=HTML).data.decode()
    # The error column: cut at a word with the whole line in the title; times relative, UTC on hover.
    cell = re.search(r'<td data-label="Error" class="error-cell"><span title="([^"]+)">([^<]+)</span>', page)
    assert cell and cell.group(1).startswith("RuntimeError: the model server answered 500 word")
    assert cell.group(2).endswith("word…") and len(cell.group(2)) <= 80
    assert re.search(r'<time datetime="[^"]+" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">(just now|\d+ s ago)</time>', page)
