"""In a real browser (headless Chromium, Playwright, against a real gunicorn): the canceled
filter of the jobs list, the replay button taking a failed job to success on a real worker,
the overview's charts, and the pages at a phone's 390 px width without sideways scrolling.
The chromium fixture skips or fails as tests/test_web_browser.py explains."""

from __future__ import annotations

import json
import re

import pytest

from jobs import deadletter
from jobs.core import control, lease, states
from jobs.enqueue import enqueue
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

LONG_ERROR = ("RuntimeError: the model server at https://models.internal.example.com/v1/chat/completions?"
              "deployment=classifier-large-2026-11 answered 500 after 60 s\nTraceback (most recent call last):\n"
              + '  File "/srv/leash/jobs/models/openai_backend.py", line 210, in call\n' * 8)


def job(conn, n=3, kind="classify", **payload):
    body = {"items": [f"item {i}" for i in range(n)], "labels": ["yes", "no"]} if kind == "classify" else {}
    job_id, _ = enqueue(conn, kind, body | payload, owner="shared", max_attempts=payload.pop("max_attempts", 3))
    return job_id


def open_page(chromium, server, width=1100):
    context = chromium.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.server_url = server.url
    return context, page


def no_sideways_scroll(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_the_canceled_filter_lists_canceled_jobs_apart_from_failures(conn, env, web_server, chromium):
    server = web_server()
    queued, canceled, failed = job(conn), job(conn), job(conn)
    control.cancel(conn, canceled)
    lease.claim(conn, failed, "leash", "w").fail("RuntimeError: boom", permanent=True)
    context, page = open_page(chromium, server)
    try:
        page.goto(f"{server.url}/jobs")
        assert page.inner_text("#filter-canceled .count") == "1" and page.inner_text("#filter-failed .count") == "1"
        page.click("#filter-canceled")
        page.wait_for_url(re.compile(r"state=canceled"))
        rows = page.locator("#jobs tbody tr")
        assert rows.count() == 1 and canceled[:10] in rows.inner_text()
        assert page.inner_text("#jobs tbody .state") == "canceled"
        page.click("#filter-failed")
        page.wait_for_url(re.compile(r"state=failed"))
        assert page.locator("#jobs tbody tr").count() == 1 and failed[:10] in page.inner_text("#jobs tbody")
        assert queued[:10] not in page.inner_text("#jobs")
    finally:
        context.close()


def test_the_replay_button_takes_a_failed_job_to_success(conn, env, burst, web_server, chromium):
    server = web_server()
    conn.set("test:broken:replay-browser", 1)  # the bug: item 1 fails until it is fixed
    job_id, _ = enqueue(conn, "breaks_at", {"items": ["a", "b", "c"], "break_at": 1, "flag": "replay-browser"},
                        owner="shared", max_attempts=1)
    burst()
    wait_for(lambda: states.status(conn, job_id)["state"] == "failed", 30, message="the job to fail")
    context, page = open_page(chromium, server)
    try:
        page.goto(f"{server.url}/jobs/{job_id}")
        assert page.inner_text("#replay-command") == f"leash replay {job_id}"
        conn.delete("test:broken:replay-browser")  # the fix is deployed
        page.click("#replay-button")
        page.click("#confirm-button")  # the confirm step
        wait_for(lambda: states.status(conn, job_id)["state"] == "queued", 10, message="the replay to be queued")
        burst()
        page.wait_for_selector("#state.state-succeeded", timeout=30_000)  # the page follows the job by itself
        assert not page.is_visible("#replay-button")
        fields = states.status(conn, job_id)
        assert (fields["state"], fields["done"], fields["attempts"]) == ("succeeded", 3, 1)
        assert deadletter.audit_log(conn, 1)[0]["actor"] == "web:shared"
    finally:
        context.close()


def test_the_overview_draws_its_charts(conn, env, web_server, chromium):
    server = web_server()
    job(conn)
    lease.claim(conn, job(conn), "leash", "w").fail("RuntimeError: boom", permanent=True)
    for width in (1100, 390):
        context, page = open_page(chromium, server, width=width)
        try:
            page.goto(f"{server.url}/overview")
            for chart in ("queue-depth", "jobs-per-hour", "failures-per-hour"):
                box = page.locator(f"#{chart} svg").bounding_box()
                assert box and box["width"] > 300 and box["height"] > 80, (chart, width, box)
            heights = page.eval_on_selector_all("#jobs-per-hour rect.bar", "bars => bars.map(b => b.getBBox().height)")
            assert len(heights) == 24 and heights[-1] > 0 and not any(heights[:-1])
            assert page.locator("#failures-per-hour rect.bar[data-value='1']").count() == 1
            assert no_sideways_scroll(page), width
        finally:
            context.close()


def test_the_pages_fit_a_390_px_phone_without_sideways_scrolling(conn, env, web_server, chromium):
    server = web_server()
    failed = job(conn, n=4)
    attempt = lease.claim(conn, failed, "leash", "a-worker-with-a-rather-long-host-name.example.internal-4242")
    attempt.heartbeat(item=(0, json.dumps("yes " * 40)))
    attempt.fail(LONG_ERROR, permanent=True)
    context, page = open_page(chromium, server, width=390)
    try:
        for path in (f"/jobs/{failed}", "/jobs", "/"):
            page.goto(server.url + path)
            assert no_sideways_scroll(page), (path, page.evaluate("document.documentElement.scrollWidth"))
        page.goto(f"{server.url}/jobs/{failed}")
        assert page.is_visible("#replay-button") and page.is_visible("#error")
    finally:
        context.close()
