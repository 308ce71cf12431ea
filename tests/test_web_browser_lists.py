"""In a real browser (headless Chromium, one per module) at a laptop's 1280 px and a phone's 390 px:
My jobs with tokens, cost and duration that never break inside a word or a number, the job page
headed and titled by the job's name, the overview's workers and running jobs, the confirm step of
Cancel without JavaScript, the skip link and the input borders' contrast, and a batch job's
details with its "Look now" button taking a finished batch to its results at once.

Screenshots for the README are rewritten only with LEASH_UPDATE_SCREENSHOT=1."""

from __future__ import annotations

import json
import os
import time

import pytest

from jobs.core import lease, states
from jobs.enqueue import enqueue
from jobs.read.money import money
from jobs.usage.meter import Pending
from tests.conftest import ROOT, wait_for
from tests.fake_openai import MODEL
from tests.test_batch_jobs import only_batch, submit_batch, waiting

pytestmark = pytest.mark.slow

WIDTHS = (1280, 390)
UPDATE_SCREENSHOTS = os.environ.get("LEASH_UPDATE_SCREENSHOT") == "1"


def open_page(browser, width: int, javascript: bool = True):
    context = browser.new_context(viewport={"width": width, "height": 900}, java_script_enabled=javascript)
    return context, context.new_page()


def no_sideways_scroll(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def lines_of(page, selector: str) -> list[int]:
    """How many lines each matching element's text takes (1: it did not wrap)."""
    return page.eval_on_selector_all(selector, """els => els.map(el => {
        const range = document.createRange(); range.selectNodeContents(el);
        return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size; })""")


def contrast(page, selector: str) -> float:
    """The contrast of an element's border colour against white (WCAG's formula)."""
    return page.eval_on_selector(selector, """el => {
        const rgb = getComputedStyle(el).borderTopColor.match(/\\d+/g).slice(0, 3).map(Number);
        const lin = c => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
        const L = 0.2126 * lin(rgb[0]) + 0.7152 * lin(rgb[1]) + 0.0722 * lin(rgb[2]);
        return 1.05 / (L + 0.05); }""")


def jobs_with_money(conn) -> tuple[str, str]:
    """A succeeded job that cost $0.000037 and a running one, both named."""
    done, _ = enqueue(conn, "classify", {"items": ["good", "bad", "fine"], "labels": ["positive", "negative"]},
                      owner="shared", name="Support inbox, March")
    attempt = lease.claim(conn, done, "leash", "worker-1")
    for index in range(3):
        attempt.heartbeat(item=(index, json.dumps("positive")), usage=Pending(
            "m", "classify", calls=1, input=1200, output=35, nusd=37_000 // 3 + (index == 0)))
    attempt.finish({"items": 3})
    running, _ = enqueue(conn, "classify", {"items": [f"item {i}" for i in range(200)],
                                            "labels": ["positive", "negative"]}, owner="shared", name="Reviews")
    start = time.time() - 120  # 40 items over two minutes: 20 items a minute
    attempt = lease.claim(conn, running, "leash", "worker-2", now=start)
    for index in range(40):
        attempt.heartbeat(item=(index, json.dumps("negative")), now=start + 3 * (index + 1))
    return done, running


def test_my_jobs_the_job_page_and_the_overview_read_well_at_1280_and_390_px(conn, env, web_server, chromium):  # noqa: F811
    server = web_server()
    done, running = jobs_with_money(conn)
    for width in WIDTHS:
        context, page = open_page(chromium, width)
        try:
            page.goto(f"{server.url}/jobs")
            assert no_sideways_scroll(page), width
            assert page.inner_text(f"tr:has(a[href='/jobs/{done}']) td.cost") == "$0.000037"
            assert page.inner_text(f"tr:has(a[href='/jobs/{done}']) td.tokens") == "3,705"
            # Numbers, states and kinds never break inside: no "classif/y", "succeed/ed", "200/20/0".
            for selector in ("td.num", "span.done", "td span.state", "td[data-label=Kind]"):
                assert set(lines_of(page, selector)) == {1}, (width, selector, lines_of(page, selector))
            if width == 1280:
                assert page.eval_on_selector("main", "m => m.getBoundingClientRect().width") > 1100
                if UPDATE_SCREENSHOTS:
                    page.screenshot(path=str(ROOT / "docs" / "screenshot-jobs.png"), full_page=True)
            elif UPDATE_SCREENSHOTS:
                page.screenshot(path=str(ROOT / "docs" / "screenshot-jobs-phone.png"), full_page=True)

            page.goto(f"{server.url}/jobs/{done}")
            assert page.title() == "Support inbox, March · succeeded · leash"
            assert page.inner_text("h1") == "Support inbox, March"
            assert "$0.000037" in page.inner_text("#usage")
            assert no_sideways_scroll(page), width

            page.goto(f"{server.url}/overview")
            assert no_sideways_scroll(page), width
            assert "Reviews" in page.inner_text("#running-jobs")
            assert page.inner_text("#running-count") == "1"
            assert page.inner_text("#items-per-minute") == "20"
            assert page.locator("#workers").count() == 1
            assert "$0.000037" in page.inner_text("#cost-per-day")
            if width == 1280 and UPDATE_SCREENSHOTS:
                page.screenshot(path=str(ROOT / "docs" / "screenshot-overview.png"), full_page=True)
        finally:
            context.close()


def test_cancel_asks_first_without_javascript_and_the_page_has_a_skip_link_and_visible_inputs(
        conn, env, web_server, chromium):  # noqa: F811
    server = web_server()
    job_id, _ = enqueue(conn, "classify", {"items": ["a", "b"], "labels": ["x", "y"]}, owner="shared", name="Oops")
    for width in WIDTHS:
        context, page = open_page(chromium, width, javascript=False)
        try:
            page.goto(f"{server.url}/")
            page.keyboard.press("Tab")
            assert page.evaluate("document.activeElement.className") == "skip"
            assert page.is_visible("a.skip") and page.get_attribute("a.skip", "href") == "#main"
            for box in ("#items", "#name", "#kind"):
                assert contrast(page, box) >= 3, (box, contrast(page, box))
            if width == 390:
                page.goto(f"{server.url}/jobs/{job_id}")
                page.click("#cancel-button")
                assert page.inner_text("#confirm-title") == "Cancel this job?"
                assert no_sideways_scroll(page)
                assert states.status(conn, job_id)["state"] == "queued", "nothing happens before the confirm"
                page.click("#confirm-button")
                assert page.inner_text("#state") == "canceled"
        finally:
            context.close()


def test_a_batch_jobs_page_shows_its_provider_batch_and_look_now_reads_it_at_once(
        conn, env, workers, batch_env, web_server, chromium):  # noqa: F811
    env.setenv("LEASH_BATCH_POLL_SECONDS", "600")  # the next look would be ten minutes away
    env.setenv("LEASH_MODEL_PRICES", json.dumps({MODEL: {"input": 1.0, "output": 2.0, "batch": 0.5}}))
    server = web_server()
    job_id, _ = submit_batch(conn, "t", 10, owner="shared", name="Overnight batch")
    workers.start()
    status = waiting(conn, job_id)
    batch_id = only_batch(batch_env)
    for width in WIDTHS:
        context, page = open_page(chromium, width, javascript=False)
        try:
            page.goto(f"{server.url}/jobs/{job_id}")
            assert batch_id in page.inner_text("#batch-ids")
            assert "0 of 10 requests done at the provider" in page.inner_text("#batch")
            assert page.is_visible("#batch-expires") and page.is_visible("#next-look")
            assert status["batch"]["next_look_at"][:16] in page.inner_text("#next-look").replace(" ", "T")
            assert no_sideways_scroll(page), width
        finally:
            context.close()
    batch_env.batches.complete(batch_id)
    context, page = open_page(chromium, 1280, javascript=False)
    try:
        # The job waits at its provider holding no worker: the overview lists that worker idle.
        page.goto(f"{server.url}/overview")
        assert page.locator("#workers tbody tr").count() == 1
        assert page.inner_text("#workers tbody tr td[data-label=State]") == "idle"
        assert page.inner_text("#busy-workers") == "0 of 1"
        page.goto(f"{server.url}/jobs/{job_id}")
        page.click("#look-now")
        assert "a worker looks within seconds" in page.inner_text("#next-look")
        wait_for(lambda: states.status(conn, job_id)["state"] == "succeeded", 30,
                 message="the look to read the finished batch (not ten minutes later)")
        page.goto(f"{server.url}/jobs/{job_id}")
        assert "the provider answered 10 of 10 requests" in page.inner_text("#batch")
        cost = states.status(conn, job_id)["cost_usd"]
        assert cost and f"a request on average at the batch price ({money(cost)} in all)" in page.inner_text("#batch")
    finally:
        context.close()
