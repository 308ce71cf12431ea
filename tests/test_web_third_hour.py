"""What a user notices once the first jobs have run: the job's name as its page's heading and
title, usage that does not say "no model calls yet" when every call failed, a replay marked in
the attempts with elapsed time and speed counted from it, the jobs list's tokens, cost and
duration, and the skip link."""

from __future__ import annotations

import json
import re
import time

import pytest

from jobs import deadletter, keys
from jobs.core import lease, states
from jobs.usage.meter import Pending
from tests.web_support import HTML, csrf_from


@pytest.fixture
def browser(app):
    browser = app.test_client()
    browser.token = csrf_from(browser.get("/", headers=HTML).data)
    return browser


@pytest.fixture
def api(app):
    """An API caller (no session cookie, so no CSRF token needed), apart from the page reader."""
    return app.test_client()


def submit(client, items=("good film", "bad film", "fine"), **extra):
    body = {"kind": "classify", "items": list(items), "labels": ["positive", "negative"], **extra}
    response = client.post("/jobs", json=body)
    assert response.status_code == 202, response.get_json()
    return response.get_json()["job_id"]


def page(client, path: str) -> str:
    response = client.get(path, headers=HTML)
    assert response.status_code == 200
    return response.data.decode()


def test_the_job_page_is_headed_and_titled_by_the_jobs_name(api, client, conn):
    named = submit(api, name="March reviews")
    html = page(client, f"/jobs/{named}")
    assert re.search(r"<title>March reviews · queued · leash</title>", html)
    assert '<h1 id="job-title">March reviews</h1>' in html and f'<code id="job-id">{named}</code>' in html
    unnamed = submit(api)
    assert f"<title>Job {unnamed[:10]} · queued · leash</title>" in page(client, f"/jobs/{unnamed}")
    assert 'href="#main"' in html and '<main id="main"' in html, "a skip link to the content"


def test_a_job_whose_calls_all_failed_does_not_say_no_model_calls_yet(api, client, conn):
    job_id = submit(api, max_attempts=1)
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.fail("ModelUnavailable: the model server at http://127.0.0.1:9/v1 failed (503): down", permanent=False)
    html = page(client, f"/jobs/{job_id}")
    usage = re.search(r'<dd id="usage">(.*?)</dd>', html, re.S).group(1)
    assert "no model calls yet" not in usage and "nothing was billed" in usage
    assert "no model calls yet" in page(client, f"/jobs/{submit(api)}"), "a job not yet run says so"


def test_a_replay_is_marked_and_elapsed_and_speed_count_from_it(api, client, conn):
    job_id = submit(api, items=[f"item {i}" for i in range(4)], max_attempts=1)
    start = time.time() - 3600
    first = lease.claim(conn, job_id, "leash", "worker-a", now=start)
    first.heartbeat(item=(0, '"positive"'), now=start + 10)
    first.fail("RuntimeError: boom", permanent=True, now=start + 20)
    selection = deadletter.select(conn, [job_id])
    deadletter.replay(conn, selection.matched, "tester", {"ids_given": 1}, now=start + 3000)
    again = lease.claim(conn, job_id, "leash", "worker-b", now=start + 3590)
    for index in (1, 2, 3):
        again.heartbeat(item=(index, '"negative"'), now=start + 3590 + 2 * index)
    again.finish({"items": 4}, now=start + 3597)
    html = page(client, f"/jobs/{job_id}")
    rows = re.findall(r"<tr( class=\"replay-start\")?><td>(\d+)(.*?)</td>", html.split('id="history"')[1].split("</table>")[0])
    assert [(number, bool(marked), "replay" in rest) for marked, number, rest in rows] == [
        ("1", False, False), ("1", True, True)]
    assert re.search(r'<dd id="elapsed">7 s since the replay</dd>', html), "not the 3,597 s since the first start"
    assert re.search(r"· (0\.4|0\.5) items/s", html), "3 items in 7 s, not 4 in an hour"
    assert "(replayed; first started" in html


def test_my_jobs_shows_tokens_cost_and_duration(api, client, conn):
    job_id = submit(api, name="Costed")
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.heartbeat(item=(0, json.dumps("positive")), usage=Pending("m", "classify", calls=1, input=30, output=7,
                                                                       nusd=37_000))
    html = page(client, "/jobs")
    header = re.findall(r"<th(?: [^>]*)?>(.*?)</th>", html)
    assert header == ["Job", "Kind", "State", "Progress", "Tokens", "Cost", "Duration", "Submitted", "Error"]
    assert '<td data-label="Tokens" class="num tokens">37</td>' in html
    assert '<td data-label="Cost" class="num cost">$0.000037</td>' in html
    assert 'class="num done"' in html and "1/3" in html
    assert states.status(conn, job_id)["usage"]["calls"] == 1


def test_the_overview_lists_workers_running_jobs_throughput_and_cost_and_refreshes_itself(api, client, conn):
    job_id = submit(api, name="Busy one")
    conn.hset(keys.job(job_id), "worker", "w-1")
    attempt = lease.claim(conn, job_id, "leash", "w-1")
    attempt.heartbeat(item=(0, json.dumps("positive")), usage=Pending("m", "classify", calls=1, input=3, output=1,
                                                                       nusd=1_234_000))
    html = page(client, "/overview")
    assert '<meta http-equiv="refresh"' in html, "refreshes without JavaScript"
    assert 'id="running-jobs"' in html and "Busy one" in html
    assert 'id="workers"' in html and 'id="throughput"' in html
    assert re.search(r'id="items-per-minute"[^>]*>\d+', html)
    assert "$0.0012" in html, "cost per day, with its significant digits"


def test_look_now_is_refused_with_a_409_for_a_job_not_waiting_at_its_provider(api, client, conn):
    job_id = submit(api)
    refused = api.post(f"/jobs/{job_id}/look")
    assert refused.status_code == 409 and "not waiting at its provider" in refused.get_json()["error"]
    assert api.post("/jobs/no-such-job/look").status_code == 404
