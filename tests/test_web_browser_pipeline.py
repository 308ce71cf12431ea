"""A pipeline's page in a real browser (headless Chromium, Playwright): every stage with its
state and link, kept fresh by the job page's poller as the stages run, without a reload; and it
fits a phone. The chromium fixture skips or fails as tests/test_web_browser.py explains."""

from __future__ import annotations

import pytest

from jobs.intake import pipelines, submission

pytestmark = pytest.mark.slow

BODY = {"name": "reviews", "stages": [
    {"name": "classify", "kind": "classify", "items": ["good film", "bad film"], "labels": ["positive", "negative"]},
    {"name": "shout", "kind": "count", "delay": 0, "items_from": {"stage": "classify", "label": "negative"}}]}


def test_the_pipeline_page_follows_its_stages_and_links_to_them(conn, env, web_server, chromium, burst):
    server = web_server()
    submitted = pipelines.submit(conn, pipelines.read(BODY, "shared"), submission)
    context = chromium.new_context(viewport={"width": 1100, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{server.url}/pipelines/{submitted.pipeline_id}")
        assert page.inner_text("#state").startswith("queued")
        assert page.locator("#stages tbody tr").count() == 2
        assert page.is_visible("#cancel-button")
        burst()
        # The poller swaps the fresh section in: no reload.
        page.wait_for_selector("#state.state-succeeded", timeout=20_000)
        assert "succeeded" in page.inner_text("#stage-shout")
        assert not page.is_visible("#cancel-button")
        page.click("#stage-shout a")
        page.wait_for_url(f"**/jobs/{submitted.stages[1][1]}")
        page.click("#pipeline-link a")
        page.wait_for_url(f"**/pipelines/{submitted.pipeline_id}")
        phone = context.new_page()
        phone.set_viewport_size({"width": 390, "height": 800})
        phone.goto(f"{server.url}/pipelines/{submitted.pipeline_id}")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        context.close()
