"""In a real browser (headless Chromium, Playwright, against a real web server) at 1280 and
390 px: the failures page shows the groups and their jobs without sideways scrolling, replays
a group through its confirm step, and is reached from the overview and from a failed job.
The chromium fixture skips or fails as tests/test_web_browser.py explains."""

from __future__ import annotations

import re

import pytest

from jobs import keys
from jobs.core import states
from jobs.deadletter.synthetic import FailedJob, write_failed_jobs
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

WIDTHS = (1280, 390)


def failed(conn, error: str, name: str | None = None) -> str:
    """A failed job as a worker leaves it: leash's record and RQ's (in its failed registry)."""
    [job_id] = write_failed_jobs(conn, [FailedJob(kind="classify", error=error + "\nTraceback ...", owner="shared",
                                                  payload={"items": ["a", "b"], "labels": ["yes", "no"]})])
    if name:
        conn.hset(keys.job(job_id), "name", name)
    return job_id


def open_page(chromium, width):
    context = chromium.new_context(viewport={"width": width, "height": 900})
    return context, context.new_page()


def no_sideways_scroll(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_group_is_replayed_from_the_failures_page_after_confirming(conn, env, web_server, chromium, width):
    server = web_server()
    down = [failed(conn, "ModelUnavailable: the model server at https://models.internal.example.com/v1/chat/"
                         f"completions?deployment=classifier-large-{n} failed (HTTP 503): overloaded",
                   name=f"Support inbox {n}") for n in range(3)]
    other = failed(conn, "PermanentError: the prompt is longer than the context window of model-x")
    context, page = open_page(chromium, width)
    try:
        page.goto(f"{server.url}/overview")
        page.click("#failures-link")
        page.wait_for_url(re.compile(r"/failures$"))
        assert page.inner_text("#failed-count") == "4"
        groups = page.locator("section.failure-group")
        assert groups.count() == 2
        first = groups.nth(0)
        assert first.locator(".count").inner_text() == "3" and "(HTTP 503)" in first.inner_text()
        assert first.locator("ul.failed-jobs li").count() == 3
        assert no_sideways_scroll(page), f"the failures page scrolls sideways at {width} px"
        first.locator("button.replay-group").click()
        page.wait_for_selector("#confirm-button")
        assert page.inner_text("#confirm-title") == "Replay 3 failed jobs?"
        assert no_sideways_scroll(page)
        assert all(states.status(conn, j)["state"] == "failed" for j in down), "nothing replayed before the confirm"
        page.click("#confirm-button")
        page.wait_for_selector("#replayed")
        assert "Replayed 3 jobs" in page.inner_text("#replayed")
        wait_for(lambda: all(states.status(conn, j)["state"] == "queued" for j in down), 10,
                 message="the group's jobs to be queued")
        assert states.status(conn, other)["state"] == "failed"
        assert page.inner_text("#failed-count") == "1"
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_ticked_jobs_are_replayed_and_a_failed_job_links_to_its_group(conn, env, web_server, chromium, width):
    server = web_server()
    ids = [failed(conn, f"ValueError: item {n} has no text") for n in range(3)]
    context, page = open_page(chromium, width)
    try:
        page.goto(f"{server.url}/jobs/{ids[0]}")
        page.click("#failure-group-link")
        page.wait_for_url(re.compile(r"/failures\?.*#group-"))
        anchor = page.url.split("#", 1)[1]
        group = page.locator(f"#{anchor}")
        assert group.locator("ul.failed-jobs li").count() == 3
        group.locator(f'input[value="{ids[1]}"]').check()
        group.locator("button.replay-selected").click()
        page.wait_for_selector("#confirm-button")
        assert page.inner_text("#confirm-title") == "Replay 1 failed job?"
        page.click("#confirm-button")
        page.wait_for_selector("#replayed")
        assert [states.status(conn, j)["state"] for j in ids] == ["failed", "queued", "failed"]
        assert no_sideways_scroll(page)
    finally:
        context.close()
