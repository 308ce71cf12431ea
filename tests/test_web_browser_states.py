"""The job page in a real browser (headless Chromium, Playwright) in each state a person
meets — running with its ETA, stale, retrying with its history, failed with the traceback
folded away, canceled, succeeded with its downloads — and the form's template field and
errors. Jobs are put in each state by the lifecycle's own transitions, against a real
web server; the chromium fixture skips or fails as tests/test_web_browser.py explains."""

from __future__ import annotations

import json
import time

import pytest

from jobs.core import control, lease
from jobs.enqueue import enqueue

pytestmark = pytest.mark.slow

TRACEBACK = ("ValueError: the model answered in French\nTraceback (most recent call last):\n"
             '  File "/srv/leash/jobs/kinds.py", line 80, in classify\n    raise ValueError(...)\n')


def job(conn, n=6, **payload):
    job_id, _ = enqueue(conn, "classify", {"items": [f"item {i}" for i in range(n)], "labels": ["yes", "no"],
                                           **payload}, owner="shared", max_attempts=3)
    return job_id


@pytest.fixture
def browser_page(conn, env, web_server, chromium):
    server = web_server()
    context = chromium.new_context(viewport={"width": 1100, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.server_url = server.url
    yield page
    context.close()


def test_running_stale_retrying_failed_canceled_and_succeeded_pages(conn, browser_page):
    page, url = browser_page, browser_page.server_url

    running = job(conn)
    attempt = lease.claim(conn, running, "leash", "worker-one")
    for i in range(3):
        attempt.heartbeat(item=(i, json.dumps("yes")), now=time.time())
    page.goto(f"{url}/jobs/{running}")
    assert page.inner_text("#state") == "running"
    text = page.inner_text("#progress-text")
    assert "3 of 6 items (50%)" in text and "items/s" in text and "left" in text
    assert page.locator("#results tbody tr").count() == 6  # results while it runs, pending ones marked
    assert page.locator("#results .pending").count() == 3

    # The lease runs out (2 s in tests) with nobody renewing it: the poller swaps the badge in.
    page.wait_for_selector("#stale", timeout=15_000)
    assert "the worker stopped reporting" in page.inner_text("#stale")

    retrying = job(conn)
    lease.claim(conn, retrying, "leash", "worker-two").fail(TRACEBACK, permanent=False)
    page.goto(f"{url}/jobs/{retrying}")
    assert page.inner_text("#state") == "queued"
    assert page.inner_text("#error") == "ValueError: the model answered in French"
    assert "did not finish" in page.inner_text("#error-box h2")
    assert page.locator("#history tbody tr").count() == 1
    assert page.inner_text("#history td.ended") == "ValueError: the model answered in French"
    assert "worker-two" in page.inner_text("#history")

    failed = job(conn)
    lease.claim(conn, failed, "leash", "w").fail(TRACEBACK, permanent=True)
    page.goto(f"{url}/jobs/{failed}")
    assert page.inner_text("#state") == "failed" and "Why it failed" in page.inner_text("#error-box")
    assert not page.is_visible("#traceback pre")  # folded away
    page.click("#traceback summary")
    shown = page.inner_text("#traceback pre")
    assert shown.splitlines()[0] == "Traceback (most recent call last):" and len(shown.splitlines()) == 3

    canceled = job(conn)
    control.cancel(conn, canceled)
    page.goto(f"{url}/jobs/{canceled}")
    assert page.inner_text("#state") == "canceled" and page.is_visible("#canceled-note")
    assert not page.is_visible("#error-box")

    done = job(conn)
    attempt = lease.claim(conn, done, "leash", "w")
    for i in range(6):
        attempt.heartbeat(item=(i, json.dumps("no")))
    attempt.finish({"items": 6})
    page.goto(f"{url}/jobs/{done}")
    assert page.inner_text("#state") == "succeeded" and page.inner_text("#history td.ended") == "succeeded"
    with page.expect_download() as download:
        page.click("#download-csv")
    lines = open(download.value.path(), encoding="utf-8").read().splitlines()
    assert lines[0] == "index,item,result,calls,input_tokens,output_tokens,cache_hits" and lines[1] == "0,item 0,no,,,," and len(lines) == 7


def test_the_form_has_a_template_for_prompt_and_shows_every_error_at_once(conn, browser_page):
    page, url = browser_page, browser_page.server_url
    page.goto(url + "/")
    page.select_option("#kind", "classify")
    page.click("button[type=submit]")
    assert page.is_visible("#items-error") and page.is_visible("#labels-error")
    assert "Give at least one item" in page.inner_text("#items-error")

    page.select_option("#kind", "prompt")
    page.fill("#template", "One line about: {item}")
    page.fill("#items", "a quiet morning\na loud evening")
    page.click("button[type=submit]")
    page.wait_for_url(lambda address: "/jobs/" in address)
    assert page.inner_text("#template") == "One line about: {item}"
    assert page.inner_text("#state") in ("queued", "running")
