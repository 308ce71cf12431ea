"""In a real browser (headless Chromium, Playwright, against a real web server) at 1280 and
390 px: the overview names a batch job waiting at its provider as such, every chart's axis
labels are drawn inside its chart, nothing scrolls sideways; rq-dashboard leads back to leash
and fits a phone. The chromium fixture skips or fails as tests/test_web_browser.py explains."""

from __future__ import annotations

import re

import pytest

from jobs.core import lease
from jobs.enqueue import enqueue
from jobs.usage.meter import Pending
from tests.test_web_overview_batch import waiting_at_provider
from tests.web_support import finish_job

pytestmark = pytest.mark.slow

WIDTHS = (1280, 390)
#: Each axis label's box against its chart's: what is drawn outside the chart is cut off.
LABELS_OUTSIDE = """
() => [...document.querySelectorAll("svg.chart")].flatMap(svg => {
  const box = svg.getBoundingClientRect();
  return [...svg.querySelectorAll("text.axis")].map(t => [t.textContent, t.getBoundingClientRect(), box])
    .filter(([, r, b]) => r.left < b.left - 0.5 || r.right > b.right + 0.5)
    .map(([text]) => svg.closest("section").id + ": " + text);
})
"""


#: What sticks out past the window's right edge (for a failure's message).
WIDE = """() => [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > innerWidth + 1)
  .slice(0, 5).map(e => `${e.tagName}#${e.id}.${e.className} ${Math.round(e.getBoundingClientRect().right)}px`)"""


def open_page(chromium, width: int):
    context = chromium.new_context(viewport={"width": width, "height": 900})
    return context, context.new_page()


def no_sideways_scroll(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_overview_names_a_batch_job_at_its_provider_and_keeps_its_axes_readable(conn, env, web_server,
                                                                                   chromium, width):
    used, _ = enqueue(conn, "classify", {"items": ["x"], "labels": ["a", "b"]}, owner="shared")
    lease.claim(conn, used, "leash", "w").heartbeat(item=(0, '"a"'), usage=Pending("m", "classify", calls=40,
                                                                                  input=200_000, output=40_000))
    finish_job(conn, used, ["a"])  # ended: the only running job is the batch one
    job_id = waiting_at_provider(conn)
    server = web_server(extra_env={"LEASH_DEV": "1"})
    context, page = open_page(chromium, width)
    try:
        page.goto(f"{server.url}/overview")
        assert page.inner_text("#at-provider-count") == "1" and page.inner_text("#running-count") == "0"
        row = page.locator("#running-jobs tbody tr", has=page.locator(f"a[href='/jobs/{job_id}']"))
        assert "waiting at the provider" in row.inner_text() and "0/2" not in row.inner_text()
        assert page.evaluate(LABELS_OUTSIDE) == []
        assert re.search(r"\d+k", page.inner_text("#tokens-per-day")), "token counts in short figures"
        assert no_sideways_scroll(page), f"the overview scrolls sideways at {width} px"
        page.click("text=Queue dashboard")
        page.wait_for_selector(".leash-back")
        # Measured once the page has drawn what it shows: its stylesheets loaded, and its script has
        # filled the queues table (rq-dashboard redraws it from JSON after the page loads).
        page.wait_for_load_state("load")
        page.wait_for_selector("#queues tbody tr >> text=leash")
        assert no_sideways_scroll(page), f"rq-dashboard scrolls sideways at {width} px: {page.evaluate(WIDE)}"
        intro, table = page.locator("p.intro").bounding_box(), page.locator("#queues").bounding_box()
        assert intro["y"] + intro["height"] <= table["y"] + 1, "its intro overlaps its table"
        page.click(".leash-back >> text=Back to leash")
        page.wait_for_url(re.compile(r"/overview$"))
    finally:
        context.close()
